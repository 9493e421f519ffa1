package route

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/meshnet/shardd/verify"
)

// With --exact workers (bf16 boundary, the default), 16 concurrent
// generations of 128 tokens through a 2-shard route each equal their own
// solo run and the whole model rounded to bf16 where the route rounds,
// token for token and logit for logit, though sessions move between KV
// streams on the way; and a worker killed and restarted mid-generation
// changes no token when the head replays the lost session
// (Options.ReplayRecovery). Seed 3 of the tiny preset is one whose bf16
// rounding flips a greedy token against the unrounded model.
func TestExactRoute(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real workers")
	}
	model, shards := tinySplit(t, 3)
	// 17 KV streams of 256 tokens each.
	args := []string{"--exact", "--max-sessions", "16", "--ctx-tokens", "4352"}
	ports := []int{freePort(t), freePort(t)}
	procs := []*proc{
		serve(t, shards[0], "127.0.0.1:0", append(args, "--metrics-listen", fmt.Sprint("127.0.0.1:", ports[0]))...),
		serve(t, shards[1], "127.0.0.1:0", append(args, "--metrics-listen", fmt.Sprint("127.0.0.1:", ports[1]))...),
	}
	addrs := []string{procs[0].addr, procs[1].addr}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := Dial(ctx, addrs, Options{StepTimeout: 30 * time.Second, ReplayRecovery: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	const n, sessions = 128, 16
	rng := rand.New(rand.NewPCG(3, 16))
	prompts := make([][]int32, sessions)
	for i := range prompts {
		prompts[i] = make([]int32, 2+rng.IntN(30))
		for j := range prompts[i] {
			prompts[i][j] = int32(rng.IntN(512))
		}
	}
	// gen also returns the bits of the logits each token was sampled from.
	gen := func(p []int32, pause func(k int)) ([]int32, Stats, [][]uint32, error) {
		var got []int32
		var bits [][]uint32
		req := Request{Prompt: p, MaxTokens: n, Logits: func(_ int, l []float32) {
			b := make([]uint32, len(l))
			for i, v := range l {
				b[i] = math.Float32bits(v)
			}
			bits = append(bits, b)
		}}
		st, err := r.Generate(ctx, req, func(tok int32) error {
			got = append(got, tok)
			if pause != nil {
				pause(len(got))
			}
			return nil
		})
		return got, st, bits, err
	}

	together := make([][]int32, sessions)
	var aloneBits [][]uint32
	togetherBits := make([][][]uint32, sessions)
	var wg sync.WaitGroup
	errs := make([]error, sessions)
	for i := range sessions {
		wg.Go(func() { together[i], _, togetherBits[i], errs[i] = gen(prompts[i], nil) })
	}
	wg.Wait()
	// The sessions moved between KV streams on the way (see
	// llamacpp.streams), which the comparisons below show changed no bit.
	copies := 0.0
	for i, port := range ports {
		c := metric(t, port, "shardd_streams_copies_total")
		t.Logf("worker %d: %v stream copies, %v placeholder rows", i, c, metric(t, port, "shardd_streams_placeholder_rows_total"))
		copies += c
	}
	if copies == 0 {
		t.Fatal("no session moved to another KV stream: the check below does not cover moves")
	}
	for i := range sessions {
		if errs[i] != nil {
			t.Fatalf("generation %d: %v", i, errs[i])
		}
		alone, _, bits, err := gen(prompts[i], nil)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			aloneBits = bits
		}
		if !slices.Equal(together[i], alone) {
			t.Fatalf("generation %d: with 15 others %v, alone %v", i, together[i], alone)
		}
		// Not only the tokens: every logit is bitwise the solo run's.
		for k := range bits {
			if !slices.Equal(togetherBits[i][k], bits[k]) {
				t.Fatalf("generation %d, token %d: logits with 15 others differ from alone", i, k)
			}
		}
		want, err := verify.Greedy(model, prompts[i], n, 1, 2)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(alone, want) {
			t.Fatalf("generation %d: route %v, whole model rounded after layer 2 %v", i, alone, want)
		}
	}

	// A restart mid-generation: worker 1 is killed after 40 tokens and
	// comes back on its address; the head replays the session.
	reached, restarted := make(chan struct{}), make(chan struct{})
	var got []int32
	var st Stats
	var bits [][]uint32
	done := make(chan error, 1)
	go func() {
		var err error
		got, st, bits, err = gen(prompts[0], func(k int) {
			if k == 40 {
				close(reached)
				<-restarted
			}
		})
		done <- err
	}()
	<-reached
	addr := procs[1].addr
	procs[1].cmd.Process.Kill()
	procs[1].cmd.Wait()
	procs[1] = serve(t, shards[1], addr, args...)
	close(restarted)
	if err := <-done; err != nil {
		t.Fatalf("generation through the restart: %v (worker log: %s)", err, procs[1].log)
	}
	if st.Recoveries < 1 {
		t.Fatalf("no recovery happened: %+v", st)
	}
	if !slices.Equal(got, together[0]) {
		t.Fatalf("after a restart %v, uninterrupted %v", got, together[0])
	}
	// Not only the tokens: every logit after the recovery is bitwise the
	// uninterrupted run's (a recovery by one prefill of the sequence moves
	// them in the last bits).
	for k := range bits {
		if !slices.Equal(bits[k], aloneBits[k]) {
			t.Fatalf("token %d: logits after the restart differ from the uninterrupted run's", k)
		}
	}
}
