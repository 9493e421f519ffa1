package sched

import (
	"math"
	"time"
)

// Cancel answers, at now, queued work of session id at epoch or older (one work id,
// or all) with CANCELLED. An item already partly run is rewound. Work of a
// newer epoch than the signal's is not the signal's to end. Older work
// must end here: a Release at a newer epoch drops the session's state and
// hands its sequence to the next session, and a chunk of the old epoch
// part-way through its iterations would run its remaining rows into it.
// It returns how many items were cancelled.
func (s *Scheduler) Cancel(now time.Time, id string, epoch uint64, workID string) int {
	s.at = now
	return s.cancel(id, epoch, workID)
}

func (s *Scheduler) cancel(id string, epoch uint64, workID string) int {
	q := s.queues[id]
	if q == nil {
		return 0
	}
	n := 0
	kept := q.items[:0]
	for _, w := range q.items {
		if (workID != "" && w.WorkID != workID) || w.Epoch > epoch {
			kept = append(kept, w)
			continue
		}
		if w.admitted {
			if w.Mode == Stateless {
				s.fx.trim(s.scratch, 0)
				s.owner = nil
			} else {
				s.fx.trim(w.Seq, w.First)
				s.store.Truncate(w.Sess, w.First)
			}
		}
		s.refuse(w, ErrCancelled)
		s.retire(w)
		s.pending--
		n++
	}
	clear(q.items[len(kept):])
	q.items = kept
	if len(kept) == 0 {
		s.dropQueue(q)
	}
	return n
}

// dropQueue forgets an empty session queue.
func (s *Scheduler) dropQueue(q *sessQueue) {
	for i, r := range s.ring {
		if r == q {
			s.ring = append(s.ring[:i], s.ring[i+1:]...)
			break
		}
	}
	delete(s.queues, q.id)
	q.id = ""
	s.spare = append(s.spare, q)
}

// Release cancels, at now, session id's queued work and drops its state.
func (s *Scheduler) Release(now time.Time, id string, epoch uint64) (bool, error) {
	s.at = now
	s.cancel(id, epoch, "")
	s.gather.forget(id)
	return s.store.Release(id, epoch)
}

// Sweep drops, at now, the sessions whose TTL has passed.
func (s *Scheduler) Sweep(now time.Time) {
	s.at = now
	s.store.Sweep()
}

// Shutdown answers everything still queued with CANCELLED and frees the
// cached results.
func (s *Scheduler) Shutdown() {
	for len(s.ring) > 0 {
		q := s.ring[0]
		s.cancel(q.id, math.MaxUint64, "") // every epoch's
	}
	for s.results.EvictOldest() {
	}
}
