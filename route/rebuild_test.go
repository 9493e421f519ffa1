package route

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnet/shardd/engine"
	"github.com/meshnet/shardd/engine/enginetest"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/argmax"
)

// A worker with one session slot evicts a generation between the chunks of
// its prefill whenever another generation runs there. The head rebuilds
// from position 0 and finishes with the tokens it would have had alone; a
// session evicted during every rebuild fails with ErrStateLost after
// maxRebuilds, not with a bare cache miss.
func TestPrefillRebuildsAfterEviction(t *testing.T) {
	addrs := enginetest.ServeRoute(t, 2, 0, engine.Config{MaxSessions: 1, EvictGrace: -1})
	var intrude atomic.Int32 // steps of the outer generation that still get an intruder
	var r *Route
	inside := atomic.Bool{}
	intruder := func() {
		if inside.Swap(true) {
			return
		}
		defer inside.Store(false)
		// The outer session's slot is free once its worker has finished
		// the step, a moment after the head saw the output: retry as a
		// head does after a retryable refusal.
		for try := 0; ; try++ {
			_, err := r.Generate(context.Background(), Request{Prompt: []int32{9, 9}, MaxTokens: 1}, func(int32) error { return nil })
			var refused *RefusedError
			if errors.As(err, &refused) && refused.Code == shardv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED && try < 100 {
				time.Sleep(time.Millisecond)
				continue
			}
			if err != nil {
				t.Errorf("intruder: %v", err)
			}
			return
		}
	}
	ctx := context.Background()
	var err error
	r, err = Dial(ctx, addrs, Options{StepTimeout: 10 * time.Second, PrefillChunk: 4, Observe: func(s StepSample) {
		// After the last hop acknowledges a prefill chunk, another
		// session takes the only slot on both workers.
		if s.Hop == 1 && !s.Decode && !inside.Load() && intrude.Add(-1) >= 0 {
			intruder()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	generate := func() ([]int32, Stats, error) {
		var got []int32
		st, err := r.Generate(ctx, Request{Prompt: prompt, MaxTokens: 6}, func(tok int32) error { got = append(got, tok); return nil })
		return got, st, err
	}
	alone, _, err := generate()
	if err != nil {
		t.Fatal(err)
	}

	intrude.Store(1) // once, after the first chunk
	got, st, err := generate()
	if err != nil {
		t.Fatalf("with one eviction: %v", err)
	}
	if !slices.Equal(got, alone) || st.Recoveries != 1 {
		t.Fatalf("with one eviction: tokens %v (alone %v), %d recoveries, want 1", got, alone, st.Recoveries)
	}

	intrude.Store(1 << 20) // after every chunk
	_, st, err = generate()
	if !errors.Is(err, ErrStateLost) || st.Recoveries != maxRebuilds {
		t.Fatalf("evicted during every rebuild: %v after %d recoveries, want ErrStateLost after %d", err, st.Recoveries, maxRebuilds)
	}
}

// Request.Logits sees the logits each token was sampled from, in order.
func TestLogitsHook(t *testing.T) {
	addrs := enginetest.ServeRoute(t, 2, 0, engine.Config{})
	r, err := Dial(context.Background(), addrs, Options{StepTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var toks []int32
	var seen [][]float32
	_, err = r.Generate(context.Background(), Request{Prompt: []int32{3, 1, 4}, MaxTokens: 5,
		Logits: func(n int, l []float32) {
			if n != len(seen) {
				t.Errorf("logits for token %d after %d", n, len(seen))
			}
			seen = append(seen, slices.Clone(l))
		}}, func(tok int32) error { toks = append(toks, tok); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != len(toks) || len(toks) != 5 {
		t.Fatalf("%d logits rows for %d tokens", len(seen), len(toks))
	}
	for i, l := range seen {
		if argmax.Index(l) != toks[i] {
			t.Fatalf("token %d is %d, its logits' argmax %d", i, toks[i], argmax.Index(l))
		}
	}
}
