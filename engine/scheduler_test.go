package engine

import (
	"context"

	"testing"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// A newer epoch supersedes the session's old state: a decode against the old
// state is a declared miss, and a fresh prefill under the new epoch works.
func TestNewerEpochSupersedes(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{})
	s := w.open(t, "epochs", 1)
	if o := s.prefillTokens(1, 1, 2, 3); o.ack == nil {
		t.Fatal(o.status)
	}
	s.epoch = 2
	s.chunk(s.envelope(2, decodeM, 3, 1, 3), s.tokensTensor([]int32{4}))
	if o := s.result(); code(o) != cMiss || o.status.Error.ActualPastLen != 0 {
		t.Fatalf("old state survived a new epoch: %v", o.status)
	}
	if o := s.prefillTokens(3, 1, 2, 3, 4); o.ack == nil || o.ack.CacheResult.PastLen != 4 {
		t.Fatalf("prefill under the new epoch: %v", o.status)
	}
	// A decode step inherits the stream's epoch, which the new epoch's
	// chunk moved on.
	if o := s.decodeToken(4, 4, 5); o.ack == nil || o.ack.CacheResult.PastLen != 5 {
		t.Fatalf("decode step after the new epoch: %v", o.status)
	}
	s.epoch = 1
	s.chunk(s.envelope(5, decodeM, 5, 1, 5), s.tokensTensor([]int32{6}))
	if o := s.result(); code(o) != cStale {
		t.Fatalf("old epoch after the new one: %v", o.status)
	}
}

// An evicted session's next DECODE is a declared CACHE_MISS (actual 0), and
// the backend sequence it held serves the session that displaced it.
func TestEvictedSessionMisses(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{MaxSessions: 1})
	a, b := w.open(t, "evict-a", 1), w.open(t, "evict-b", 1)
	if o := a.prefillTokens(1, 1, 2, 3); o.ack == nil {
		t.Fatal(o.status)
	}
	if o := b.prefillTokens(1, 4, 5); o.ack == nil { // the only slot: a is evicted
		t.Fatal(o.status)
	}
	if o := a.decodeToken(2, 3, 6); code(o) != cMiss || o.status.Error.ActualPastLen != 0 {
		t.Fatalf("evicted session: %v", o.status)
	}
	if o := b.decodeToken(2, 2, 6); o.ack == nil || o.ack.CacheResult.PastLen != 3 {
		t.Fatalf("the new session: %v", o.status)
	}
	var evictions int64
	waitFor(t, w.eng, func() bool { evictions = int64(w.eng.sched.Store().Evictions); return true })
	if evictions != 1 {
		t.Fatalf("evictions %d", evictions)
	}
}

// TestOnlyRecentResultsKept: a worker keeps the results of a session's last
// max-inflight steps to answer duplicates. An older step, which a head that
// follows the credits can no longer resend, gets a bare duplicate Ack: it
// was applied, and its result buffer has gone back to the pool.
func TestOnlyRecentResultsKept(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{MaxInflightChunks: 2})
	s := w.open(t, "recent", 1)
	if o := s.prefillTokens(1, 1, 2, 3); o.ack == nil {
		t.Fatal(o.status)
	}
	for step, pos := uint64(2), 3; step <= 5; step, pos = step+1, pos+1 {
		if o := s.decodeToken(step, pos, int32(10+step)); o.ack == nil {
			t.Fatal(o.status)
		}
	}
	for _, step := range []uint64{4, 5} {
		o := s.decodeToken(step, int(step)+1, int32(10+step))
		if o.ack == nil || !o.ack.Duplicate || o.chunk == nil {
			t.Fatalf("step %d, one of the last two: ack %v, result %v, status %v", step, o.ack, o.chunk != nil, o.status)
		}
	}
	for _, step := range []uint64{1, 2, 3} {
		var o outcome
		if step == 1 {
			o = s.prefillTokens(1, 1, 2, 3)
		} else {
			o = s.decodeToken(step, int(step)+1, int32(10+step))
		}
		if o.ack == nil || !o.ack.Duplicate || o.chunk != nil {
			t.Fatalf("step %d, older: ack %v, result %v, status %v", step, o.ack, o.chunk != nil, o.status)
		}
	}
	// Still decoding from where it was: nothing was re-applied.
	if o := s.decodeToken(6, 7, 16); o.ack == nil || o.ack.CacheResult.PastLen != 8 {
		t.Fatalf("next step: ack %v status %v", o.ack, o.status)
	}
}

// A session whose state is dropped takes its cached results with it: on
// release and on eviction the results cache is emptied of them at once
// (their buffers back to the pool), not when the byte budget gets to them.
func TestDroppedSessionFreesResults(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{MaxSessions: 1})
	held := func() int64 {
		var n int64
		waitFor(t, w.eng, func() bool { var st Stats; w.eng.sched.Stats(&st); n = st.ResultsBytes; return true })
		return n
	}
	a := w.open(t, "drop-a", 1)
	if o := a.prefillTokens(1, 1, 2, 3); o.ack == nil {
		t.Fatal(o.status)
	}
	if o := a.decodeToken(2, 3, 4); o.ack == nil {
		t.Fatal(o.status)
	}
	if held() == 0 {
		t.Fatal("no results cached after two steps")
	}
	if _, err := w.client.Release(context.Background(), &shardv1.ReleaseRequest{SchemaVersion: 1, RouteSessionId: "drop-a", RouteEpoch: 1}); err != nil {
		t.Fatal(err)
	}
	if n := held(); n != 0 {
		t.Fatalf("%d bytes of results held after the release", n)
	}

	b, c := w.open(t, "drop-b", 1), w.open(t, "drop-c", 1)
	if o := b.prefillTokens(1, 1, 2); o.ack == nil {
		t.Fatal(o.status)
	}
	one := held()
	if o := c.prefillTokens(1, 5, 6); o.ack == nil { // the only slot: b is evicted
		t.Fatal(o.status)
	}
	if n := held(); n != one {
		t.Fatalf("after the eviction %d bytes held, want c's %d alone", n, one)
	}
}

// TestReleaseAtNewerEpochEndsRunningWork: a Release at a newer epoch than
// the session's arrives while a prompt chunk of the old epoch is part-way
// through its iterations. The state is dropped and its sequence goes to the
// next session; the old chunk must end there (CANCELLED), not run its
// remaining rows into the sequence the new session now holds (the soak
// with kills saw llama_decode refuse such a forward, and every other item
// in it fail with INTERNAL).
func TestReleaseAtNewerEpochEndsRunningWork(t *testing.T) {
	w, fb := gated(t, Config{PrefillIterationTokens: 4, DecodeQuiet: 1})
	a, b := w.open(t, "old", 1), w.open(t, "next", 1)
	a.chunk(a.envelope(1, prefill, 0, 8, 0), a.tokensTensor([]int32{1, 2, 3, 4, 5, 6, 7, 8}))
	<-fb.Entered // rows 0..3 of the 8 are inside Forward
	done := make(chan error, 1)
	go func() {
		_, err := w.client.Release(context.Background(), &shardv1.ReleaseRequest{SchemaVersion: 1, RouteSessionId: "old", RouteEpoch: 2})
		done <- err
	}()
	waitUntil(t, func() bool { return len(w.eng.control) == 1 })
	b.chunk(b.envelope(1, prefill, 0, 3, 0), b.tokensTensor([]int32{9, 10, 11}))
	fb.Open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if o := a.result(); code(o) != cCancelled {
		t.Fatalf("the old epoch's chunk after its state was released: ack %v, status %v", o.ack, o.status)
	}
	if o := b.result(); o.ack == nil || o.ack.CacheResult.PastLen != 3 {
		t.Fatalf("the session that took the sequence: ack %v, status %v", o.ack, o.status)
	}
	waitFor(t, w.eng, func() bool {
		if err := w.eng.drv.positionsAgree(); err != nil {
			t.Error(err)
		}
		return true
	})
}
