package engine

import (
	"testing"

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
	fb.Gate <- struct{}{}
	if o := dec.result(); o.ack == nil || o.ack.CacheResult.PastLen != 3 {
		t.Fatalf("decode: %v %v", o.ack, o.status)
	}
	fb.Open()
	o := long.result()
	if o.ack == nil || o.ack.CacheResult.PastLen != 32 {
		t.Fatalf("prefill after preemption: %v %v", o.ack, o.status)
	}
	if w.eng.Stats().Preemptions != 1 {
		t.Fatalf("preemptions %d", w.eng.Stats().Preemptions)
	}
}

// preemptScene starts a preemptible fake worker whose forwards wait at a
// gate (entered tells of each), opens a decoding session whose prompt has
// run and a second session for a long prefill.
func preemptScene(t *testing.T) (w *worker, fb *fakeBackend, entered chan struct{}, dec, long *session) {
	fb = newFake(true, true)
	fb.Preempt = make(chan struct{}, 1)
	w = startWorker(t, preemptibleFake{Fake: fb}, fakeMeta(), Config{DecodeQuiet: 1, PrefillIterationTokens: 64})
	entered = make(chan struct{}, 64)
	waitFor(t, w.eng, func() bool { fb.Gate, fb.Entered = make(chan struct{}), entered; return true })
	t.Cleanup(fb.Open)
	dec, long = w.open(t, "decoder", 1), w.open(t, "long", 1)
	dec.chunk(dec.envelope(1, prefill, 0, 2, 0), dec.tokensTensor([]int32{1, 2}))
	<-entered
	fb.Gate <- struct{}{}
	if o := dec.result(); o.ack == nil {
		t.Fatalf("prefill: %v", o.status)
	}
	return w, fb, entered, dec, long
}
