package engine

import (
	"math"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// cancel answers queued work of session id at epoch or older (one work id,
// or all) with CANCELLED. An item already partly run is rewound. Work of a
// newer epoch than the signal's is not the signal's to end. Older work
// must end here: a Release at a newer epoch drops the session's state and
// hands its sequence to the next session, and a chunk of the old epoch
// part-way through its iterations would run its remaining rows into it.
// It returns how many items were cancelled.
func (s *scheduler) cancel(id string, epoch uint64, workID string) int {
	q := s.queues[id]
	if q == nil {
		return 0
	}
	n := 0
	kept := q.items[:0]
	for _, w := range q.items {
		if (workID != "" && w.workID != workID) || w.epoch > epoch {
			kept = append(kept, w)
			continue
		}
		if w.admitted {
			if w.mode == shardv1.CacheMode_CACHE_MODE_STATELESS {
				s.fx.trim(s.scratch, 0)
				s.owner = nil
			} else {
				s.fx.trim(w.seq, w.first)
				s.store.Truncate(w.sess, w.first)
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
func (s *scheduler) dropQueue(q *sessQueue) {
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

// release cancels id's queued work and drops its state.
func (s *scheduler) release(id string, epoch uint64) (bool, error) {
	s.cancel(id, epoch, "")
	s.gather.forget(id)
	return s.store.Release(id, epoch)
}

// shutdown answers everything still queued with CANCELLED and frees the
// cached results.
func (s *scheduler) shutdown() {
	for len(s.ring) > 0 {
		q := s.ring[0]
		s.cancel(q.id, math.MaxUint64, "") // every epoch's
	}
	for s.results.EvictOldest() {
	}
}
