package sched

import (
	"github.com/meshnet/shardd/internal/wireerr"
	"github.com/meshnet/shardd/kvcache"
)

// keepRecent records that sess's result for ref is cached and drops the
// session's results older than its last MaxInflightChunks. A head that
// follows the credits can resend only un-acknowledged work, and it cannot
// have sent this step while more than that many were un-acknowledged, so
// an older result can never be asked for by it again (a late copy from a
// relay still gets a bare duplicate Ack). Dropping them at once sends their
// buffers back to the pool instead of holding them until the byte budget
// evicts them, so steady decoding does not allocate a fresh result buffer
// (for a last hop, 4 x vocab bytes) every step.
func (s *Scheduler) keepRecent(sess *kvcache.Session, ref kvcache.StepRef) {
	sess.Results = append(sess.Results, ref)
	keep := int(s.cfg.MaxInflightChunks) // at least 1 (Config.Defaults)
	if extra := len(sess.Results) - keep; extra > 0 {
		for _, old := range sess.Results[:extra] {
			if r, ok := s.results.Remove(resultKey{sess.ID, old.Epoch, old.Step}); ok {
				r.Release()
			}
		}
		sess.Results = append(sess.Results[:0], sess.Results[extra:]...)
	}
}

// dropResults frees the cached results of a session whose state is
// dropped: a duplicate is recognised through the session's state, so once
// that is gone the results can never be asked for, and holding them until
// the byte budget pushes them out would keep their pooled buffers from
// the pool.
func (s *Scheduler) dropResults(sess *kvcache.Session) {
	s.prefixKeep(sess)
	for _, old := range sess.Results {
		if r, ok := s.results.Remove(resultKey{sess.ID, old.Epoch, old.Step}); ok {
			r.Release()
		}
	}
	sess.Results = sess.Results[:0]
}

// refuse answers w with err and releases its output so far (w is not
// finished).
func (s *Scheduler) refuse(w *Item, err error) {
	w.releaseOut()
	s.fx.reply(Reply{Item: w, Err: err})
}

type admitResult int

const (
	admitRun admitResult = iota
	admitWait
	admitDrop
	// admitDone: the item was answered whole from the prefix cache and
	// popped.
	admitDone
)

// admit checks w against the session state when it reaches the head of its
// session's queue. Refused items are answered here.
func (s *Scheduler) admit(w *Item) admitResult {
	if w.admitted {
		return admitRun
	}
	drop := func(err error) admitResult {
		s.refuse(w, err)
		s.retire(w)
		return admitDrop
	}
	if w.Gone != nil && w.Gone.Load() {
		s.fx.reply(Reply{Item: w, Quiet: true}) // accounting only; nobody reads
		s.retire(w)
		return admitDrop
	}
	if w.Deadline != 0 && s.at.UnixNano() > w.Deadline {
		return drop(ErrDeadline)
	}
	if w.Mode == Stateless {
		if s.owner != nil && s.owner != w {
			return admitWait
		}
		s.owner, w.Seq, w.admitted = w, s.scratch, true
		return admitRun
	}
	id := w.Session
	if err := s.store.CheckEpoch(id, w.Epoch); err != nil {
		return drop(err)
	}
	sess, ok := s.store.Lookup(id)
	if ok && w.Epoch > sess.Epoch {
		s.store.NewEpoch(sess, w.Epoch) // a newer epoch supersedes the old state
	}
	if ok && sess.HasStep && w.Step <= sess.LastStep {
		s.duplicate(w, sess)
		s.retire(w)
		return admitDrop
	}
	miss := func() admitResult {
		actual := uint64(0)
		if ok {
			actual = uint64(sess.PastLen)
		}
		s.fx.reply(Reply{Item: w, Err: wireerr.Errorf(ErrCacheMiss, "expected %d tokens, holding %d", w.Expected, actual), ActualPastLen: actual})
		s.retire(w)
		return admitDrop
	}
	switch w.Mode {
	case Prefill:
		if w.First == 0 {
			var err error
			if sess, err = s.store.Begin(id, w.Epoch, w.Length); err != nil {
				return drop(err)
			}
			ok = true
		} else if !ok || sess.PastLen != w.First {
			// A later chunk, or a follow-up prompt appended to a finished
			// one: either way it must start exactly where the cache ends.
			w.Expected = uint64(w.First)
			return miss()
		}
		w.Hit = w.First > 0
	case Decode:
		if !ok || !sess.PrefillDone || uint64(sess.PastLen) != w.Expected || uint64(w.First) != w.Expected {
			return miss()
		}
		w.Hit = true
	default:
		return drop(wireerr.Errorf(ErrEnvelope, "cache mode %d", w.Mode))
	}
	// A session's first prompt chunk is part of its admission: it may
	// refuse, but not preempt others; every later step of an admitted
	// session may preempt idle ones rather than fail.
	admitted := w.Mode != Prefill || w.First > 0
	if err := s.store.Reserve(sess, w.Tokens, admitted); err != nil {
		return drop(err)
	}
	s.pin(w, sess)
	w.Sess, w.Seq, w.admitted = sess, sess.Seq, true
	switch w.Mode {
	case Prefill:
		return s.prefixHit(w)
	case Decode:
		s.prefixFeed(w)
	}
	return admitRun
}

// duplicate answers a step that was already applied: its cached result sent
// again marked duplicate, or, when it has left the cache, a bare duplicate
// acknowledgement. Nothing is re-applied.
func (s *Scheduler) duplicate(w *Item, sess *kvcache.Session) {
	if r, ok := s.results.Get(resultKey{sess.ID, w.Epoch, w.Step}); ok {
		r.Retain()
		s.fx.reply(Reply{Item: w, Out: r, Duplicate: true})
		return
	}
	s.fx.reply(Reply{Item: w, Duplicate: true, PastLen: uint64(sess.PastLen)})
}
