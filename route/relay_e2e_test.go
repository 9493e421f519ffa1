package route

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/meshnet/shardd/relay"
	"github.com/meshnet/shardd/verify"
)

// TestRelayedRoute: a 3-shard route of the tiny model (f32 boundaries)
// whose middle hop goes through a relay generates the tokens of the same
// route with every hop direct and of the whole model, while the relay cuts
// the middle hop's connection twice: once in the middle of a response,
// after the worker applied the step (the head's retry of the same step is
// acknowledged as a duplicate), and once between steps.
func TestRelayedRoute(t *testing.T) {
	model, shards := tinyShards(t, 3)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := &relay.Relay{}
	go rl.Serve(ln)
	defer rl.Close()
	relayAddr := ln.Addr().String()
	a := serve(t, shards[0], "127.0.0.1:0", "--boundary", "f32")
	b := serve(t, shards[1], "127.0.0.1:0", "--boundary", "f32", "--relay", relayAddr+"/middle")
	c := serve(t, shards[2], "127.0.0.1:0", "--boundary", "f32")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	direct, err := Dial(ctx, []string{a.addr, b.addr, c.addr}, Options{StepTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	relayed, err := Dial(ctx, []string{a.addr, "relay://" + relayAddr + "/middle", c.addr}, Options{StepTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer relayed.Close()

	const n = 24
	for _, prompt := range [][]int32{{1, 17, 42, 7, 99}, {5, 300, 8, 64, 2, 11, 3}} {
		want, err := verify.Greedy(model, prompt, n, 1)
		if err != nil {
			t.Fatal(err)
		}
		var viaDirect []int32
		if _, err := direct.Generate(ctx, Request{Prompt: prompt, MaxTokens: n}, func(tok int32) error {
			viaDirect = append(viaDirect, tok)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var viaRelay []int32
		var armed int
		st, err := relayed.Generate(ctx, Request{Prompt: prompt, MaxTokens: n}, func(tok int32) error {
			viaRelay = append(viaRelay, tok)
			switch len(viaRelay) {
			case 6:
				// Into the middle worker's next result: 100 bytes is
				// past its Ack for the step just taken, should that
				// still be on its way (some 60 bytes by its fields; the
				// head reads Acks late), and short of the result's end
				// (some 800).
				// 16 bytes cut that Ack instead whenever it left after
				// this callback: the retried step had never been sent,
				// no duplicate came back, and the test failed 1 run in
				// 8 or more once the frame transport got faster.
				armed = rl.ResetAfter(100)
			case 12:
				rl.Reset()
			}
			return nil
		})
		if err != nil {
			t.Fatalf("relayed route: %v (middle worker's log: %s)", err, b.log)
		}
		if !slices.Equal(viaDirect, want) || !slices.Equal(viaRelay, want) {
			t.Fatalf("prompt %v:\n whole model %v\n direct      %v\n relayed     %v", prompt, want, viaDirect, viaRelay)
		}
		if armed != 1 || st.Retries < 2 || st.DuplicateAcks < 1 {
			t.Fatalf("the faults did not take the retry path: armed %d, %+v", armed, st)
		}
	}
	if s := rl.Stats(); s.Paired < 4 || s.BytesToWorker == 0 || s.BytesToHead == 0 {
		t.Fatalf("relay stats %+v", s)
	}
}
