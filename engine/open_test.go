package engine

import (
	"testing"
	"time"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// TestOpenBesideForward: a session opens while another session's forward
// is still running: admission is read under the state's lock, so the open
// does not wait the forward out (a new generation's first step on a busy
// hop would otherwise wait one forward on every hop to open).
func TestOpenBesideForward(t *testing.T) {
	w, fb := gated(t, Config{})
	a := w.open(t, "a", 1)
	a.chunk(a.envelope(1, prefill, 0, 2, 0), a.tokensTensor([]int32{1, 2}))
	<-fb.Entered // a's prefill is inside Forward, held

	opened := make(chan *shardv1.SessionResponse, 1)
	go func() {
		_, resp := w.dial(t, "b", 1, nil)
		opened <- resp
	}()
	select {
	case resp := <-opened:
		if resp.GetAccepted() == nil {
			t.Fatalf("b refused: %v", resp)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the open waited for the forward")
	}
	fb.Gate <- struct{}{}
	if o := a.result(); o.ack == nil {
		t.Fatalf("held item: %v", o.status)
	}
}

// TestReopenAfterRelease: a stream that released its session ends only
// once the release is applied, so the same id opened again right after the
// end is a new session whose work the old release cannot cancel (the
// fuzzer's find when the release was posted and not waited for).
func TestReopenAfterRelease(t *testing.T) {
	w, fb := gated(t, Config{})
	x := w.open(t, "x", 1)
	a := w.open(t, "a", 1)
	a.chunk(a.envelope(1, prefill, 0, 2, 0), a.tokensTensor([]int32{1, 2}))
	<-fb.Entered // a's prefill is inside Forward, held
	x.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Release{Release: &shardv1.ReleaseSignal{RouteSessionId: "x", RouteEpoch: 1}}})
	closed := make(chan struct{})
	go func() { x.close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("the stream ended before its release was applied")
	case <-time.After(50 * time.Millisecond):
	}
	fb.Gate <- struct{}{}
	<-closed
	if o := a.result(); o.ack == nil {
		t.Fatalf("held item: %v", o.status)
	}
	fb.Open()
	y := w.open(t, "x", 1)
	if o := y.prefillTokens(1, 1, 2); o.ack == nil {
		t.Fatalf("x again: %v", o.status)
	}
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
	waitUntil(t, func() bool { return len(w.eng.control) == 1 }) // the release, queued

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
