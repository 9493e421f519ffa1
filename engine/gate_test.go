package engine

import (
	"testing"
	"time"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

func TestAwaitSendsNothingPending(t *testing.T) {
	d := &driver{gate: newSendGate()}
	d.awaitSends()
	if d.stats.SendWaits != 0 {
		t.Fatalf("waited with nothing pending: %d waits", d.stats.SendWaits)
	}
}

func TestAwaitSendsUntilReleased(t *testing.T) {
	d := &driver{gate: newSendGate()}
	g := d.gate
	// A stale token from an earlier forward must not end the wait early.
	g.done <- struct{}{}
	g.add()
	g.add()
	r := reply{gate: g}
	released := make(chan struct{})
	go func() {
		r.release()
		r.release()
		close(released)
	}()
	d.awaitSends()
	if n := g.left.Load(); n != 0 {
		t.Fatalf("returned with %d replies unsent", n)
	}
	<-released
	if d.stats.SendWaits != 1 || d.stats.SendWaitsExpired != 0 {
		t.Fatalf("waits %d, expired %d", d.stats.SendWaits, d.stats.SendWaitsExpired)
	}
}

func TestAwaitSendsBounded(t *testing.T) {
	d := &driver{gate: newSendGate()}
	g := d.gate
	g.add() // a reply whose peer does not read
	start := time.Now()
	d.awaitSends()
	if took := time.Since(start); took < sendWait {
		t.Fatalf("gave up after %v, before the %v bound", took, sendWait)
	}
	if d.stats.SendWaitsExpired != 1 || !d.sendStuck {
		t.Fatalf("after the bound: expired %d, stuck %v", d.stats.SendWaitsExpired, d.sendStuck)
	}
	// While that reply is out, forwards do not wait, even for new replies.
	g.add()
	d.awaitSends()
	if d.stats.SendWaits != 1 {
		t.Fatalf("waited again while a peer was stuck: %d waits", d.stats.SendWaits)
	}
	// Once everything counted has left, forwards wait again.
	g.release()
	g.release()
	d.awaitSends()
	if d.sendStuck {
		t.Fatal("still not waiting after every reply left")
	}
	g.add()
	go g.release()
	d.awaitSends()
	if n := g.left.Load(); n != 0 || d.stats.SendWaitsExpired != 1 {
		t.Fatalf("after the peer read: %d unsent, expired %d", n, d.stats.SendWaitsExpired)
	}
}

// TestSendGateDroppedReplies: a reply a stream will never send leaves the
// gate too: one queued when the stream closes, one delivered after.
func TestSendGateDroppedReplies(t *testing.T) {
	g := newSendGate()
	st := &stream{replies: make(chan reply, 4), sendDone: make(chan struct{}), cancel: func() {}}
	close(st.sendDone) // no send loop: the reply stays queued
	g.add()
	st.deliver(reply{ack: &shardv1.Ack{}, gate: g}, false)
	if n := g.left.Load(); n != 1 {
		t.Fatalf("queued reply counted %d times", n)
	}
	st.close()
	g.add()
	st.deliver(reply{ack: &shardv1.Ack{}, gate: g}, false)
	if n := g.left.Load(); n != 0 {
		t.Fatalf("%d dropped replies still counted", n)
	}
}

// TestSendGateReleasedOnEveryPath: over the service, every result a
// forward hands to a stream leaves the driver's gate (sent, or dropped
// when the stream is cut with a step in flight), so a later forward never
// waits for a reply that will not come.
func TestSendGateReleasedOnEveryPath(t *testing.T) {
	w := startWorker(t, newFake(true, true), fakeMeta(), Config{})
	a, b := w.open(t, "gate-a", 1), w.open(t, "gate-b", 1)
	for _, s := range []*session{a, b} {
		if o := s.prefillTokens(1, 5, 6); o.ack == nil {
			t.Fatalf("prefill: %v", o.status)
		}
	}
	for step := uint64(2); step < 8; step++ {
		for _, s := range []*session{a, b} {
			if o := s.decodeToken(step, int(step), 7); o.ack == nil {
				t.Fatalf("decode %d: %v", step, o.status)
			}
		}
	}
	// b's last step leaves with its stream cut before anyone reads it.
	b.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Decode{Decode: &shardv1.DecodeStep{
		IdempotencyStep: 8, Position: 8, ExpectedPastLen: 8, Tensor: b.tokensTensor([]int32{7}), WorkId: "d",
	}}})
	b.cancel()
	if o := a.decodeToken(8, 8, 7); o.ack == nil {
		t.Fatalf("decode after the cut: %v", o.status)
	}
	d := &w.eng.drv
	waitFor(t, w.eng, func() bool { return d.gate.left.Load() == 0 })
}
