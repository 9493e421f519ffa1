package engine

import (
	"testing"
	"time"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// Scenario: a prefill-only iteration is running when a decode step arrives;
// the iteration is preempted, the decode runs first, and the prefill is
// rewound and completes from where it stood.
func TestDecodePreemptsPrefill(t *testing.T) {
	w, fb, entered, dec, long := preemptScene(t)

	// Hold the long prefill's iteration.
	ids := make([]int32, 32)
	long.chunk(long.envelope(1, prefill, 0, len(ids), 0), long.tokensTensor(ids))
	<-entered // held, preemptible
	dec.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Decode{Decode: &shardv1.DecodeStep{
		IdempotencyStep: 2, Position: 2, ExpectedPastLen: 2, Tensor: dec.tokensTensor([]int32{3})}}})
	<-entered // the decode's own (non-preemptible) iteration
	fb.gate <- struct{}{}
	if o := dec.result(); o.ack == nil || o.ack.CacheResult.PastLen != 3 {
		t.Fatalf("decode: %v %v", o.ack, o.status)
	}
	fb.open()
	o := long.result()
	if o.ack == nil || o.ack.CacheResult.PastLen != 32 {
		t.Fatalf("prefill after preemption: %v %v", o.ack, o.status)
	}
	if w.eng.preemptions.Load() != 1 {
		t.Fatalf("preemptions %d", w.eng.preemptions.Load())
	}
}

// Scenario: a prefill-only iteration is not preempted twice in a row. After
// one preemption the retried iteration runs to its end even when another
// decode step arrives meanwhile, so prompts progress under steady decoding.
func TestPreemptionNotTwiceInARow(t *testing.T) {
	w, fb, entered, dec, long := preemptScene(t)
	step := func(n uint64) {
		dec.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Decode{Decode: &shardv1.DecodeStep{
			IdempotencyStep: n, Position: n, ExpectedPastLen: n, Tensor: dec.tokensTensor([]int32{3})}}})
	}
	ids := make([]int32, 32)
	long.chunk(long.envelope(1, prefill, 0, len(ids), 0), long.tokensTensor(ids))
	<-entered // the prefill, preemptible
	step(2)
	<-entered // preempted; the decode step's iteration
	fb.gate <- struct{}{}
	if o := dec.result(); o.ack == nil || o.ack.CacheResult.PastLen != 3 {
		t.Fatalf("decode: %v %v", o.ack, o.status)
	}
	<-entered // the prefill again: this time it is not preemptible
	step(3)
	// The decode step asked for a preemption (its signal is still
	// pending), or took one.
	waitUntil(t, func() bool { return len(fb.preempt) == 1 || w.eng.preemptions.Load() > 1 })
	fb.open()
	if o := long.result(); o.ack == nil || o.ack.CacheResult.PastLen != 32 {
		t.Fatalf("prefill after one preemption: %v %v", o.ack, o.status)
	}
	if o := dec.result(); o.ack == nil || o.ack.CacheResult.PastLen != 4 {
		t.Fatalf("second decode: %v %v", o.ack, o.status)
	}
	if n := w.eng.preemptions.Load(); n != 1 {
		t.Fatalf("%d preemptions, want 1", n)
	}
}

// preemptScene starts a preemptible fake worker whose forwards wait at a
// gate (entered tells of each), opens a decoding session whose prompt has
// run and a second session for a long prefill.
func preemptScene(t *testing.T) (w *worker, fb *fakeBackend, entered chan struct{}, dec, long *session) {
	fb = newFake(true, true)
	fb.preempt = make(chan struct{}, 1)
	w = startWorker(t, preemptibleFake{fb}, fakeMeta(), Config{DecodeQuiet: 1, PrefillIterationTokens: 64})
	entered = make(chan struct{}, 64)
	waitFor(t, w.eng, func() bool { fb.gate, fb.entered = make(chan struct{}), entered; return true })
	t.Cleanup(fb.open)
	dec, long = w.open(t, "decoder", 1), w.open(t, "long", 1)
	dec.chunk(dec.envelope(1, prefill, 0, 2, 0), dec.tokensTensor([]int32{1, 2}))
	<-entered
	fb.gate <- struct{}{}
	if o := dec.result(); o.ack == nil {
		t.Fatalf("prefill: %v", o.status)
	}
	return w, fb, entered, dec, long
}

// Scenario: a decode step is due (its session's usual gap after its last
// step) sooner than one prefill token would take on the cost model: a
// queued prefill does not start a prefill-only iteration that would delay
// it. When the step comes it runs at once, with prefill tokens beside it.
func TestPrefillWaitsForDueDecode(t *testing.T) {
	fb := newFake(true, true)
	w := startWorker(t, fb, fakeMeta(), Config{DecodeQuiet: time.Minute})
	dec, long := w.open(t, "decoder", 1), w.open(t, "long", 1)
	if o := dec.prefillTokens(1, 1, 2); o.ack == nil {
		t.Fatal(o.status)
	}
	if o := dec.decodeToken(2, 2, 3); o.ack == nil {
		t.Fatal(o.status)
	}
	entered := make(chan struct{}, 64)
	waitFor(t, w.eng, func() bool {
		s := &w.eng.sched
		// A forward costs 5 s plus 1 ms a row; the decoder's next step is
		// due 2 s after its last one completed, now.
		s.cost = costModel{}
		for rows := 1; rows <= costMinRuns; rows++ {
			s.cost.add(rows, 5*time.Second+time.Duration(rows)*time.Millisecond)
		}
		s.gather.gap["decoder"] = ewma{v: 2 * time.Second, ok: true}
		s.gather.last["decoder"] = time.Now()
		fb.gate, fb.entered = make(chan struct{}), entered
		return true
	})
	t.Cleanup(fb.open)
	long.chunk(long.envelope(1, prefill, 0, 16, 0), long.tokensTensor(make([]int32, 16)))
	select {
	case <-entered:
		t.Fatal("a prefill-only iteration started with a decode step due")
	case <-time.After(100 * time.Millisecond):
	}
	var waits int64
	waitFor(t, w.eng, func() bool { waits = w.eng.sched.dueWaits; return true })
	if waits == 0 {
		t.Fatal("no wait for the due decode step was counted")
	}
	dec.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Decode{Decode: &shardv1.DecodeStep{
		IdempotencyStep: 3, Position: 3, ExpectedPastLen: 3, Tensor: dec.tokensTensor([]int32{4})}}})
	<-entered
	fb.gate <- struct{}{}
	if o := dec.result(); o.ack == nil || o.ack.CacheResult.PastLen != 4 {
		t.Fatalf("decode: %v %v", o.ack, o.status)
	}
	calls := fb.callsSeen(t, w.eng)
	if last := calls[len(calls)-1]; len(last) != 2 {
		t.Fatalf("the decode step's iteration ran rows of %v, want the decoder's and the prefill's", last)
	}
	fb.open()
	if o := long.result(); o.ack == nil || o.ack.CacheResult.PastLen != 16 {
		t.Fatalf("prefill: %v %v", o.ack, o.status)
	}
}
