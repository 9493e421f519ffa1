package sched

import (
	"time"

	"github.com/meshnet/shardd/kvcache"
)

// Outcome is what became of a planned forward: how long it took, and
// either that a decode step preempted it or the refusal its items get
// (nil: it ran; the driver has appended each planned item's output rows to
// its Out).
type Outcome struct {
	Took      time.Duration
	Preempted bool
	Err       error
}

// Advance takes in, at now, the outcome of the planned forward: the cost
// model, then the rows run (or a rewind after a preemption, or the
// failure). The items it completes or fails are answered in the Effects.
func (s *Scheduler) Advance(now time.Time, o Outcome) {
	s.at = now
	run, took := s.fwd, o.Took
	if !o.Preempted && o.Err == nil {
		s.learn(run, took)
	}
	switch {
	case o.Preempted:
		s.rewindPlanned()
		s.preemptions++
		s.preempted = true
		return
	case o.Err != nil:
		s.failPlanned(o.Err)
		return
	}
	if run.Decodes == 0 {
		s.preempted = false // a prefill-only iteration ran to its end
	}
	for _, p := range s.planned {
		w := p.Item
		w.Done += p.N
		if w.Done == w.Tokens {
			s.complete(w)
		}
	}
}

// learn takes a forward that ran into the cost model, the decode budget's
// anchor and the price of prefill rows beside decode rows.
func (s *Scheduler) learn(run Forward, took time.Duration) {
	if run.Rows <= costMaxRows {
		s.cost.add(run.Rows, took)
	}
	if run.Decodes > 0 {
		s.sinceDecodeOnly++
		if run.Rows == s.lastDecodeRows {
			s.sinceDecodeOnly = 0
			s.decodeOnly.t.add(took)
			s.decodeOnly.rows.add(time.Duration(run.Rows))
		} else if alone, ok := s.decodeTime(s.lastDecodeRows); ok && s.decodeOnly.t.ok {
			d := max(took-alone, 0) / time.Duration(run.Rows-s.lastDecodeRows)
			if run.Probe {
				s.besideRow = ewma{v: d, ok: true} // a fresh price after none for a while
			} else {
				s.besideRow.add(besideSample(d, s.besideRow))
			}
		}
	}
	if run.Limit > 0 {
		s.budgetRuns++
		if took <= run.Limit {
			s.budgetHits++
		}
	}
}

// besideSample is a measured price of a prefill row beside decode rows as
// the average takes it: no more than 4x the average so far. A forward the
// host stalled (kdamond took 250 ms in one run) would otherwise move it
// 30x in one sample; a real rise still shows within a few.
func besideSample(d time.Duration, avg ewma) time.Duration {
	if avg.ok {
		d = min(d, 4*avg.v)
	}
	return d
}

// rewindPlanned undoes a preempted iteration: every planned item goes back
// to where it stood before it (its rows are run again later).
func (s *Scheduler) rewindPlanned() {
	for _, p := range s.planned {
		s.fx.trim(p.Item.Seq, p.Item.First+p.Item.Done)
	}
}

// complete records a finished item and answers it with the output the
// submitter makes of it (Hooks.Complete).
func (s *Scheduler) complete(w *Item) {
	now := s.at
	var out []byte
	if w.Out != nil {
		out = w.Out.Bytes()
	}
	pastLen := uint64(0)
	if w.Mode == Stateless {
		s.fx.trim(s.scratch, 0)
		s.owner = nil
	} else {
		sess := w.Sess
		sess.LastStep, sess.HasStep = w.Step, true
		if w.Mode == Prefill {
			sess.PrefillDone = w.Final
		}
		s.prefixDone(w, out)
		if w.Mode == Decode || sess.PrefillDone {
			s.gather.done(w.Session, now)
		}
		pastLen = uint64(sess.PastLen)
	}
	r := s.hooks.Complete(w, now, pastLen)
	w.Out = nil
	if w.Mode != Stateless {
		r.Retain()
		s.results.Put(resultKey{w.Session, w.Epoch, w.Step}, r, r.Cost())
		s.keepRecent(w.Sess, kvcache.StepRef{Epoch: w.Epoch, Step: w.Step})
	}
	s.fx.reply(Reply{Item: w, Out: r})
	s.finish(w)
}

// LoadFailed reports, once, that a prefix load the last Plan asked for
// did not fit (its Undo ran): the planned forward must not run, and its
// items are rewound (in the Effects) to be planned again.
func (s *Scheduler) LoadFailed() bool {
	if !s.loadFailed {
		return false
	}
	s.loadFailed = false
	if s.fwd.Rows > 0 {
		s.rewindPlanned()
	}
	return true
}

// finish pops w (the head of its session's queue).
func (s *Scheduler) finish(w *Item) {
	if q := s.queues[w.Session]; q != nil && len(q.items) > 0 && q.items[0] == w {
		s.pop(q)
	}
	s.retire(w)
}

// failPlanned answers every planned item with err after a failed forward and
// rewinds the sessions to where each item began.
func (s *Scheduler) failPlanned(err error) {
	seen := map[*Item]bool{}
	for _, p := range s.planned {
		if seen[p.Item] {
			continue
		}
		seen[p.Item] = true
		s.fail(p.Item, err)
	}
}

// fail answers an admitted item with err, undoing its KV reservation.
func (s *Scheduler) fail(w *Item, err error) {
	if w.Mode == Stateless {
		s.fx.trim(s.scratch, 0)
		s.owner = nil
	} else if w.Sess != nil {
		s.fx.trim(w.Seq, w.First)
		s.store.Truncate(w.Sess, w.First)
		s.prefixDrop(w.Session)
	}
	s.refuse(w, err)
	s.finish(w)
}
