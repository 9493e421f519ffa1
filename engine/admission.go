package engine

import (
	"strings"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
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
func (s *scheduler) keepRecent(sess *kvcache.Session, ref kvcache.StepRef) {
	sess.Results = append(sess.Results, ref)
	keep := int(s.cfg.MaxInflightChunks) // at least 1 (Config.Defaults)
	if extra := len(sess.Results) - keep; extra > 0 {
		for _, old := range sess.Results[:extra] {
			if r, ok := s.results.Remove(resultKey{sess.ID, old.Epoch, old.Step}); ok {
				r.release()
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
func (s *scheduler) dropResults(sess *kvcache.Session) {
	s.prefixKeep(sess)
	for _, old := range sess.Results {
		if r, ok := s.results.Remove(resultKey{sess.ID, old.Epoch, old.Step}); ok {
			r.release()
		}
	}
	sess.Results = sess.Results[:0]
}

// refuse sends err for w and releases what w holds (w is not finished).
func (s *scheduler) refuse(w *work, err error) {
	w.releaseInput()
	if w.out != nil {
		w.out.Release()
		w.out = nil
	}
	s.fx.deliver(w.st, reply{status: statusFor(w.st.id, w.workID, w.step, err)}, true)
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
func (s *scheduler) admit(w *work) admitResult {
	if w.admitted {
		return admitRun
	}
	drop := func(err error) admitResult {
		s.refuse(w, err)
		s.retire(w)
		return admitDrop
	}
	if w.st.isClosed() {
		w.releaseInput()
		s.fx.deliver(w.st, reply{}, true) // accounting only; nobody reads
		s.retire(w)
		return admitDrop
	}
	if w.deadline != 0 && s.now().UnixNano() > w.deadline {
		return drop(ErrDeadline)
	}
	if w.mode == shardv1.CacheMode_CACHE_MODE_STATELESS {
		if s.owner != nil && s.owner != w {
			return admitWait
		}
		s.owner, w.seq, w.admitted = w, s.scratch, true
		return admitRun
	}
	id := w.st.id
	if err := s.store.CheckEpoch(id, w.epoch); err != nil {
		return drop(err)
	}
	sess, ok := s.store.Lookup(id)
	if ok && w.epoch > sess.Epoch {
		s.store.NewEpoch(sess, w.epoch) // a newer epoch supersedes the old state
	}
	if ok && sess.HasStep && w.step <= sess.LastStep {
		s.duplicate(w, sess)
		s.retire(w)
		return admitDrop
	}
	miss := func() admitResult {
		actual := uint64(0)
		if ok {
			actual = uint64(sess.PastLen)
		}
		w.releaseInput()
		st := statusFor(id, w.workID, w.step, wireerr.Errorf(ErrCacheMiss, "expected %d tokens, holding %d", w.expected, actual))
		st.Error.ActualPastLen = actual
		s.fx.deliver(w.st, reply{status: st}, true)
		s.retire(w)
		return admitDrop
	}
	switch w.mode {
	case shardv1.CacheMode_CACHE_MODE_PREFILL:
		if w.first == 0 {
			var err error
			if sess, err = s.store.Begin(id, w.epoch, w.length); err != nil {
				return drop(err)
			}
			ok = true
		} else if !ok || sess.PastLen != w.first {
			// A later chunk, or a follow-up prompt appended to a finished
			// one: either way it must start exactly where the cache ends.
			w.expected = uint64(w.first)
			return miss()
		}
		w.hit = w.first > 0
	case shardv1.CacheMode_CACHE_MODE_DECODE:
		if !ok || !sess.PrefillDone || uint64(sess.PastLen) != w.expected || uint64(w.first) != w.expected {
			return miss()
		}
		w.hit = true
	default:
		return drop(wireerr.Errorf(ErrEnvelope, "cache mode %s", w.mode))
	}
	// A session's first prompt chunk is part of its admission: it may
	// refuse, but not preempt others; every later step of an admitted
	// session may preempt idle ones rather than fail.
	admitted := w.mode != shardv1.CacheMode_CACHE_MODE_PREFILL || w.first > 0
	if err := s.store.Reserve(sess, w.tokens, admitted); err != nil {
		return drop(err)
	}
	s.pin(w, sess)
	w.sess, w.seq, w.admitted = sess, sess.Seq, true
	switch w.mode {
	case shardv1.CacheMode_CACHE_MODE_PREFILL:
		return s.prefixHit(w)
	case shardv1.CacheMode_CACHE_MODE_DECODE:
		s.prefixFeed(w)
	}
	return admitRun
}

// duplicate answers a step that was already applied: its cached result sent
// again marked duplicate, or, when it has left the cache, a bare duplicate
// acknowledgement. Nothing is re-applied.
func (s *scheduler) duplicate(w *work, sess *kvcache.Session) {
	w.releaseInput()
	if r, ok := s.results.Get(resultKey{sess.ID, w.epoch, w.step}); ok {
		s.fx.deliver(w.st, reply{res: r.ref(), duplicate: true}, true)
		return
	}
	s.fx.deliver(w.st, reply{ack: &shardv1.Ack{
		WorkId: strings.Clone(w.workID), IdempotencyStep: w.step, Duplicate: true,
		CacheResult: &shardv1.CacheResult{Mode: w.mode, PastLen: uint64(sess.PastLen), CacheHit: true},
	}}, true)
}
