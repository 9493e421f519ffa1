package route

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshnet/shardd/engine"
	"github.com/meshnet/shardd/engine/enginetest"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// standbyRoute serves a 2-hop route and, per hop, standbys more workers
// of the same shard; it returns each hop's addresses (worker first) and
// their stops.
func standbyRoute(t *testing.T, standbys int) ([][]string, [][]func()) {
	addrs, stops := make([][]string, 2), make([][]func(), 2)
	for i := range 2 {
		for range 1 + standbys {
			a, stop := enginetest.ServeShard(t, i, 2, 0, engine.Config{})
			addrs[i], stops[i] = append(addrs[i], a), append(stops[i], stop)
		}
	}
	return addrs, stops
}

func dialStandby(t *testing.T, addrs [][]string, opts Options) *Route {
	t.Helper()
	if opts.StepTimeout == 0 {
		opts.StepTimeout = 10 * time.Second
	}
	opts.Alternates = [][]string{addrs[0][1:], addrs[1][1:]}
	r, err := Dial(context.Background(), []string{addrs[0][0], addrs[1][0]}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// generateKill runs one generation and calls kill (once) when emit has
// seen after tokens; after < 0: never.
func generateKill(t *testing.T, r *Route, req Request, after int, kill func()) ([]int32, Stats, error) {
	var got []int32
	st, err := r.Generate(context.Background(), req, func(tok int32) error {
		got = append(got, tok)
		if len(got) == after {
			kill()
		}
		return nil
	})
	return got, st, err
}

// A worker killed mid-decode (either hop), or mid-prefill: the
// generation moves to the hop's standby and ends with the tokens of an
// uninterrupted run; later generations start on the standby.
func TestFailover(t *testing.T) {
	req := Request{Prompt: []int32{5, 3, 9, 1, 4, 4, 2, 8, 7, 6}, MaxTokens: 12}
	for _, c := range []struct {
		name      string
		hop       int
		prefill   bool // kill after the first prefill chunk instead
		afterToks int
		replay    bool
	}{
		{name: "hop 1 mid-decode", hop: 1, afterToks: 4},
		{name: "hop 0 mid-decode", hop: 0, afterToks: 7},
		{name: "hop 1 mid-decode, replayed", hop: 1, afterToks: 5, replay: true},
		{name: "hop 0 mid-decode, replayed", hop: 0, afterToks: 6, replay: true},
		{name: "hop 0 mid-prefill", hop: 0, prefill: true},
		// Hop 1 gone while hop 0 runs the prompt's later chunks (the
		// chunks are pipelined).
		{name: "hop 1 mid-prefill", hop: 1, prefill: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			addrs, stops := standbyRoute(t, 1)
			var once sync.Once
			var armed, killed atomic.Bool  // the uninterrupted run first
			var otherPrefills atomic.Int32 // prefill steps on the other hop after the kill
			kill := func() { once.Do(func() { stops[c.hop][0](); killed.Store(true) }) }
			opts := Options{PrefillChunk: 3, ReplayRecovery: c.replay}
			opts.Observe = func(s StepSample) {
				if c.prefill && armed.Load() && s.Hop == len(addrs)-1 && !s.Decode {
					kill()
				}
				if killed.Load() && s.Hop != c.hop && !s.Decode {
					otherPrefills.Add(1)
				}
			}
			r := dialStandby(t, addrs, opts)
			want, _, err := generateKill(t, r, req, -1, nil)
			if err != nil {
				t.Fatal(err)
			}
			after := c.afterToks
			if c.prefill {
				after = -1
			}
			armed.Store(true)
			got, st, err := generateKill(t, r, req, after, kill)
			if err != nil {
				t.Fatalf("generation with hop %d killed: %v", c.hop, err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("tokens %v, uninterrupted %v", got, want)
			}
			if len(st.Failovers) != 1 || !strings.Contains(st.Failovers[0], addrs[c.hop][1]) || st.Recoveries != 1 {
				t.Errorf("failovers %q, %d recoveries; want one onto %s", st.Failovers, st.Recoveries, addrs[c.hop][1])
			}
			if !c.prefill && otherPrefills.Load() != 0 {
				// Only the replacement replays the session; the other hop's
				// inputs did not change, and it keeps its session.
				t.Errorf("the hop not replaced ran %d prefill steps after the kill, want none", otherPrefills.Load())
			}
			if cur := r.Current()[c.hop].Addr; cur != addrs[c.hop][1] {
				t.Errorf("hop %d is %s after the failover, want the standby %s", c.hop, cur, addrs[c.hop][1])
			}
			// The next generation starts on the standby, without a failover.
			got, st, err = generateKill(t, r, req, -1, nil)
			if err != nil || !slices.Equal(got, want) || len(st.Failovers) != 0 {
				t.Errorf("next generation: %v %v, failovers %q", err, got, st.Failovers)
			}
		})
	}
}

// A standby that is itself dead is passed over for the next; the other
// hop keeps its worker.
func TestFailoverSkipsDeadStandby(t *testing.T) {
	addrs, stops := standbyRoute(t, 2)
	stops[1][1]() // the first standby of hop 1 is dead too
	r := dialStandby(t, addrs, Options{})
	req := Request{Prompt: []int32{1, 2, 3}, MaxTokens: 8}
	want, _, err := generateKill(t, r, req, -1, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, st, err := generateKill(t, r, req, 3, stops[1][0])
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("%v: %v, want %v", err, got, want)
	}
	cur := r.Current()
	if cur[1].Addr != addrs[1][2] || cur[0].Addr != addrs[0][0] {
		t.Errorf("hops %s, %s after the failover; want %s (the live standby) and %s (unchanged)", cur[0].Addr, cur[1].Addr, addrs[1][2], addrs[0][0])
	}
	if len(st.Failovers) != 1 {
		t.Errorf("failovers %q", st.Failovers)
	}
}

// A hop with no standby left fails the generation within about the step
// timeout, naming the hop; a worker that comes back is used again once it
// answers SERVING.
func TestFailoverExhausted(t *testing.T) {
	addrs, stops := standbyRoute(t, 0)
	r, err := Dial(context.Background(), []string{addrs[0][0], addrs[1][0]}, Options{StepTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	start := time.Now()
	_, _, err = generateKill(t, r, Request{Prompt: []int32{1, 2}, MaxTokens: 50}, 2, stops[1][0])
	var down *HopDownError
	if !errors.As(err, &down) || down.Hop != 1 || !strings.Contains(err.Error(), addrs[1][0]) {
		t.Fatalf("with hop 1 dead: %v, want a HopDownError naming hop 1", err)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("failed after %v; want about the step timeout (2 s)", d)
	}
}

func TestParseRoute(t *testing.T) {
	addrs, alts, err := ParseRoute("a|a2|a3, b")
	if err != nil || !slices.Equal(addrs, []string{"a", "b"}) || len(alts) != 2 || !slices.Equal(alts[0], []string{"a2", "a3"}) || len(alts[1]) != 0 {
		t.Errorf("a|a2|a3,b: %v %v %v", addrs, alts, err)
	}
	if _, alts, _ := ParseRoute("a,b"); alts != nil {
		t.Errorf("a,b: alternates %v", alts)
	}
	for _, bad := range []string{"", ",", "a,,b", "|"} {
		if _, _, err := ParseRoute(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// A hop's output is unmarshaled in place: its payloads and its name are
// views of the stream's receive buffer, which the next exchange reuses.
// The copies the history and a pipelined prefill keep must own every
// byte, the name included (CloneVT shares strings).
func TestCloneTensorOwnsItsBytes(t *testing.T) {
	src := &shardv1.NamedTensor{Name: "hidden_states", Shape: []int64{1, 2}, Dtype: shardv1.DType_DTYPE_BFLOAT16,
		Fragments: []*shardv1.TensorFragment{{FragmentCount: 1, Payload: []byte{1, 2, 3, 4}}}}
	buf, err := src.MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	var view shardv1.NamedTensor
	if err := view.UnmarshalVTUnsafe(buf); err != nil {
		t.Fatal(err)
	}
	c := cloneTensor(&view)
	clear(buf) // the receive buffer reused
	if view.Name == src.Name {
		t.Fatalf("the unmarshaled name did not alias the buffer; the test shows nothing")
	}
	if c.Name != src.Name || !bytes.Equal(c.Fragments[0].Payload, src.Fragments[0].Payload) {
		t.Fatalf("copy changed with the buffer: name %q payload %v", c.Name, c.Fragments[0].Payload)
	}
}
