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
// generation would wait for its step timeout). The tokens are those of the
// same chunks sent one after another.
func TestPrefillPipelines(t *testing.T) {
	prompt := []int32{3, 1, 4, 1, 5, 9}
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
		released := make(chan bool, 1)
		if hold {
			go func() {
				<-hop0.Entered // the first chunk
				select {
				case <-hop0.Entered: // the second, while hop 1 holds the first
					released <- true
				case <-time.After(10 * time.Second):
					released <- false
				}
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
		if hold && !<-released {
			t.Fatalf("hop 0 got no second chunk while hop 1 held the first: the chunks were not pipelined")
		}
		return got
	}
	piped := generate(Options{StepTimeout: 30 * time.Second, PipelineChunks: 3}, true)
	serial := generate(Options{StepTimeout: 30 * time.Second, PipelineChunks: -1, PrefillChunk: 2}, false)
	if len(piped) != 8 || !slices.Equal(piped, serial) {
		t.Fatalf("pipelined %v, one chunk after another %v", piped, serial)
	}
}
