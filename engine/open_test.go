package engine

import (
	"testing"
	"time"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// TestOpenBesideForward: a session opens, and a stream with nothing in
// flight ends after its release, while another session's forward is still
// running: neither waits it out (a new generation's first step on a busy
// hop would otherwise wait one forward to open and one to close). The
// release is applied once the forward is over.
func TestOpenBesideForward(t *testing.T) {
	w, fb := gated(t, Config{})
	a := w.open(t, "a", 1)
	a.chunk(a.envelope(1, prefill, 0, 2, 0), a.tokensTensor([]int32{1, 2}))
	<-fb.Entered // a's prefill is inside Forward, held

	ended := make(chan struct{})
	go func() {
		defer close(ended)
		b := w.open(t, "b", 1)
		b.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Release{Release: &shardv1.ReleaseSignal{RouteSessionId: "b", RouteEpoch: 1}}})
		b.close()
	}()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("open or close waited for the forward")
	}
	fb.Gate <- struct{}{}
	if o := a.result(); o.ack == nil {
		t.Fatalf("held item: %v", o.status)
	}
	waitFor(t, w.eng, func() bool { _, ok := w.eng.sched.Store().Peek("b"); return !ok })
}

// TestOpenBehindRelease: with every session slot held, an open that
// arrives while a release is on its way is not refused: it is decided
// again once the release is applied.
func TestOpenBehindRelease(t *testing.T) {
	w, fb := gated(t, Config{MaxSessions: 1})
	a := w.open(t, "a", 1)
	a.chunk(a.envelope(1, prefill, 0, 2, 0), a.tokensTensor([]int32{1, 2}))
	<-fb.Entered // a holds the only slot, its prefill held in Forward
	a.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Release{Release: &shardv1.ReleaseSignal{RouteSessionId: "a", RouteEpoch: 1}}})
	waitUntil(t, func() bool { return w.eng.releasing.Load() == 1 })

	opened := make(chan *shardv1.SessionResponse, 1)
	go func() {
		_, resp := w.dial(t, "c", 1, nil)
		opened <- resp
	}()
	waitUntil(t, func() bool { return len(w.eng.control) == 2 }) // the release, then c's second look
	fb.Gate <- struct{}{}
	if resp := <-opened; resp.GetAccepted() == nil {
		t.Fatalf("c refused: %v", resp)
	}
}
