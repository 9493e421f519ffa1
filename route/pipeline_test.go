package route

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/meshnet/shardd/backend/backendtest"
	"github.com/meshnet/shardd/engine"
	"github.com/meshnet/shardd/engine/enginetest"
)

// A prompt's chunks go through the hops as a pipeline: hop 0 is sent the
// second chunk while hop 1 still holds the first. Hop 1's forward is held
// until hop 0 has entered its second forward, which a head that sends
// each chunk through every hop before the next never does (the
// generation would wait for its step timeout). While hop 1 stays held,
// hop 0 runs no more than pipeAhead chunks ahead, plus the one waiting to
// be queued: the copies in flight are bounded. The tokens are those of
// the same chunks sent one after another.
func TestPrefillPipelines(t *testing.T) {
	prompt := []int32{3, 1, 4, 1, 5, 9, 2, 6}
	generate := func(opts Options, hold bool) []int32 {
		t.Helper()
		hop0 := backendtest.NewDelay(true, false, 0)
		hop1 := backendtest.NewDelay(false, true, 0)
		a0, _ := enginetest.ServeFake(t, 0, 2, hop0, engine.Config{})
		a1, _ := enginetest.ServeFake(t, 1, 2, hop1, engine.Config{})
		if hold { // after the probe each engine ran when it started
			hop0.Entered, hop1.Gate = make(chan struct{}, 64), make(chan struct{})
			t.Cleanup(hop1.Open)
		}
		r, err := Dial(context.Background(), []string{a0, a1}, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		entered := make(chan int, 1) // hop 0's forwards while hop 1 held the first chunk
		if hold {
			go func() {
				n := 0
				for timeout := 10 * time.Second; ; timeout = 300 * time.Millisecond {
					select {
					case <-hop0.Entered:
						n++
						continue
					case <-time.After(timeout):
					}
					if n > 0 {
						break
					}
				}
				entered <- n
				hop1.Open()
			}()
		}
		var got []int32
		if _, err := r.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: 8}, func(tok int32) error {
			got = append(got, tok)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if hold {
			// The first chunk, pipeAhead queued for hop 1, one waiting to be.
			if n, want := <-entered, pipeAhead+2; n != want {
				t.Fatalf("hop 0 ran %d forwards while hop 1 held the first chunk, want %d (1: the chunks were not pipelined)", n, want)
			}
		}
		return got
	}
	piped := generate(Options{StepTimeout: 30 * time.Second, PipelineChunks: len(prompt)}, true)
	serial := generate(Options{StepTimeout: 30 * time.Second, PipelineChunks: -1, PrefillChunk: 1}, false)
	if len(piped) != 8 || !slices.Equal(piped, serial) {
		t.Fatalf("pipelined %v, one chunk after another %v", piped, serial)
	}
}
