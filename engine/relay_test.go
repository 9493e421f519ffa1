package engine

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/frames"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/relay"
	"github.com/meshnet/shardd/stages/decode"
)

// viaRelay serves w's engine on frame connections registered at a relay of
// its own, and returns the worker as a head reaches it through that relay:
// no gRPC anywhere between them, so nothing can come from HTTP/2 metadata,
// deadlines or windows.
func viaRelay(t testing.TB, w *worker) *worker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := &relay.Relay{}
	go rl.Serve(ln)
	addr := ln.Addr().String()
	lis, err := relay.Listen(addr, "worker", relay.ListenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fs := w.eng.FrameServer(quietLog())
	served := make(chan struct{})
	go func() { fs.Serve(lis); close(served) }()
	client := frames.NewClient(func(ctx context.Context) (net.Conn, error) { return relay.Dial(ctx, addr, "worker") },
		frames.Config{Codec: decode.Codec{Pool: bufpool.Default}, Pool: bufpool.Default, MaxRecv: 64 << 20})
	t.Cleanup(func() {
		fs.Close()
		<-served
		rl.Close()
	})
	r := *w
	r.client, r.transport, r.relay = client, "relay", rl
	return &r
}

// TestRelayedDeadlineWhileQueued: work queued behind a held forward, whose
// in-band deadline passes before it is dequeued, is DEADLINE_EXCEEDED. The
// relayed stream has no deadline of its own: only the envelope's exists.
func TestRelayedDeadlineWhileQueued(t *testing.T) {
	w, fb := gated(t, Config{})
	w = viaRelay(t, w)
	s := w.open(t, "late", 1)
	if _, ok := s.stream.Context().Deadline(); ok {
		t.Fatal("the relayed stream has a transport deadline")
	}
	env := s.envelope(1, prefill, 0, 2, 0)
	env.WorkId = "running"
	s.chunk(env, s.tokensTensor([]int32{1, 2}))
	<-fb.Entered
	// Far enough out for the item to reach the queue on a loaded machine
	// (one past its deadline on arrival is refused there, not queued: with
	// 20 ms it sometimes was, and the test failed).
	deadline := time.Now().Add(500 * time.Millisecond)
	env = s.envelope(2, prefill, 0, 2, 0)
	env.WorkId, env.DeadlineUnixNanos = "expires", deadline.UnixNano()
	s.chunk(env, s.tokensTensor([]int32{3, 4}))
	// Both items are on the worker (the second one's arrival is seen in
	// the queue); then let the deadline pass and release the forward.
	waitUntil(t, func() bool { return w.eng.queued.Load() >= 2 })
	for time.Now().Before(deadline.Add(time.Millisecond)) {
		time.Sleep(time.Until(deadline.Add(time.Millisecond)))
	}
	fb.Gate <- struct{}{}
	if o := s.result(); o.ack == nil || o.ack.WorkId != "running" {
		t.Fatalf("running item: %v %v", o.ack, o.status)
	}
	if o := s.result(); code(o) != cDeadline || o.status.WorkId != "expires" {
		t.Fatalf("queued item past its deadline: %v", o.status)
	}
}

// TestRelayedRetryIsDuplicate: the relay cuts the connection after the
// worker applied a step; the head's retry of that step on a new connection
// is acknowledged as a duplicate with the same output, not applied twice.
func TestRelayedRetryIsDuplicate(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := viaRelay(t, startLlama(t, whole, Config{}))
	s := w.open(t, "dup", 3)
	first := s.prefillTokens(1, 1, 2, 3)
	if first.ack == nil {
		t.Fatal(first.status)
	}
	if n := w.relay.Reset(); n != 1 {
		t.Fatalf("relay reset %d connections, want 1", n)
	}
	if _, err := s.stream.Recv(); err == nil {
		t.Fatal("the stream survived the relay's reset")
	}
	s2 := w.open(t, "dup", 3)
	again := s2.prefillTokens(1, 1, 2, 3)
	if again.ack == nil || !again.ack.Duplicate || again.ack.CacheResult.GetPastLen() != 3 {
		t.Fatalf("retried step: %v %v", again.ack, again.status)
	}
	if string(again.body(t)) != string(first.body(t)) {
		t.Fatal("the duplicate's output differs from the step's")
	}
	// The session went on from where the step left it.
	if o := s2.decodeToken(2, 3, 4); o.ack == nil || o.ack.CacheResult.GetPastLen() != 4 {
		t.Fatalf("decode after the retry: %v %v", o.ack, o.status)
	}
}

// TestRelayedOpenAndUnary: refusals at open, unary errors with their
// ShardError details, and capability all come through the relay as on a
// direct hop.
func TestRelayedOpenAndUnary(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := viaRelay(t, startLlama(t, whole, Config{MaxSessions: 3}))
	ctx := context.Background()
	c, err := w.client.GetCapability(ctx, &shardv1.CapabilityRequest{SchemaVersion: 1})
	if err != nil || !c.Validated || c.MaxConcurrentSessions != 3 || c.Fingerprint.GetModelArtifactDigest() != w.id.Fingerprint.ModelArtifactDigest {
		t.Fatalf("capability %v %v", c, err)
	}
	o := w.openMsg("stale", 5)
	s := w.open(t, "stale", 5)
	if r := s.prefillTokens(1, 1, 2); r.ack == nil {
		t.Fatal(r.status)
	}
	o.RouteEpoch = 4
	if _, resp := w.dial(t, "stale", 4, o); resp.GetStatus().GetError().GetCode() != cStale || !resp.GetStatus().Terminal {
		t.Fatalf("open at a stale epoch: %v", resp)
	}
	_, err = w.client.Release(ctx, &shardv1.ReleaseRequest{SchemaVersion: 1, RouteSessionId: "stale", RouteEpoch: 4})
	st, _ := status.FromError(err)
	if st.Code() != codes.FailedPrecondition || len(st.Details()) != 1 || st.Details()[0].(*shardv1.ShardError).Code != cStale {
		t.Fatalf("stale release: %v", err)
	}
	if r, err := w.client.Release(ctx, &shardv1.ReleaseRequest{SchemaVersion: 1, RouteSessionId: "stale", RouteEpoch: 5}); err != nil || !r.Released {
		t.Fatalf("release: %v %v", r, err)
	}
	h, err := w.client.Health(ctx, &shardv1.HealthRequest{SchemaVersion: 1})
	if err != nil || h.State != shardv1.ServingState_SERVING_STATE_SERVING {
		t.Fatalf("health %v %v", h, err)
	}
}

// TestRelayUnknownWorker: a head dialling a name nobody registered is
// refused by the relay within its wait, not left hanging.
func TestRelayUnknownWorker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := &relay.Relay{WaitTimeout: 50 * time.Millisecond}
	go rl.Serve(ln)
	defer rl.Close()
	_, err = relay.Dial(context.Background(), ln.Addr().String(), "nobody")
	if !errors.Is(err, relay.ErrRefused) {
		t.Fatalf("got %v", err)
	}
}
