// Package kvcache is the per-session KV state table: route session ->
// backend sequence, tokens held, last applied step, last use.
//
// Bounded memory never depends on a release arriving: sessions are evicted
// least recently used first when a budget (sessions, KV tokens) would be
// exceeded, and after TTL without use.
//
// What an admitted session is promised: a session that says at its first
// prefill how long it will grow (Begin's reserve: the head's prompt plus
// its maximum new tokens) is admitted only when that many KV tokens are
// free beside every other session's promise, and then never finds its
// cells gone while it stays within it. A session without a reservation,
// or past it, grows while tokens are free and otherwise preempts idle
// sessions (no work queued or running) least recently used first; their
// next step is a declared CACHE_MISS and their head re-prefills them. A
// step fails for lack of KV (ErrKVBudget, retryable) only when no other
// session is idle. Eviction frees the backend sequence;
// an evicted session's next DECODE finds no state, which the engine reports
// as a declared CACHE_MISS (actual_past_len 0), never a silent stateless
// forward. A session with work queued or running is pinned and never
// evicted.
//
// The table is a strict LRU (internal/lru), not ristretto: ristretto's
// admission policy may refuse a new entry and applies writes asynchronously,
// and a session table must admit every session it has room for, at once.
//
// A Store is owned by the engine's scheduler goroutine and is not safe for
// concurrent use.
package kvcache

import (
	"time"

	"github.com/meshnet/shardd/internal/lru"
	"github.com/meshnet/shardd/internal/wireerr"
)

// Refusals.
var (
	ErrEpochStale = wireerr.New(wireerr.CodeEpochStale, "kvcache: work is for a route epoch this worker has moved past")
	ErrNoSlot     = wireerr.NewRetryable(wireerr.CodeResourceExhausted, "kvcache: no session slot is free")
	ErrKVBudget   = wireerr.NewRetryable(wireerr.CodeResourceExhausted, "kvcache: KV token budget exhausted")
	// ErrTooLong: the session's stated length exceeds the whole budget; no
	// wait makes it fit.
	ErrTooLong = wireerr.New(wireerr.CodeResourceExhausted, "kvcache: the session's length exceeds this worker's KV capacity")
)

// Session is one route session's state for this shard.
type Session struct {
	ID    string
	Epoch uint64
	Seq   int // backend sequence id
	// PastLen is the number of tokens the backend sequence holds.
	PastLen int
	// Reserved is the KV tokens promised at admission (0: none asked). The
	// store counts max(Reserved, PastLen) against its budget.
	Reserved int
	// LastStep is the highest idempotency step applied (valid when HasStep).
	LastStep uint64
	HasStep  bool
	// PrefillDone: the final chunk of the current prefill has been applied.
	PrefillDone bool
	LastUse     time.Time
	// Pins counts work queued or running for the session; a pinned session
	// is never evicted.
	Pins int
	// Results are the steps whose results the engine keeps to answer
	// duplicates, oldest first (the engine's bookkeeping; the store does
	// not read it).
	Results []StepRef
}

// StepRef names one unit of work of a session.
type StepRef struct{ Epoch, Step uint64 }

// Config bounds the store.
type Config struct {
	MaxSessions int // at most this many sessions hold state (<= sequences available)
	MaxTokens   int // KV tokens across all sessions
	// SessionTokens, when positive, caps each session's tokens: a backend
	// that gives every session a KV stream of its own (the exact
	// mode) holds no more per session, whatever is free elsewhere.
	SessionTokens int
	TTL           time.Duration
	// EvictGrace: a session used within this long is not evicted to make
	// room for another (the one asking is refused instead, retryably).
	// Under more sessions than slots, evicting sessions in the middle of a
	// generation makes every head rebuild and none finish; 0 evicts any
	// idle session.
	EvictGrace time.Duration
	// OnDrop, when set, is told of a session whose state is dropped
	// (release, TTL or eviction) before the store forgets it, so the
	// owner can free what it keeps for the session (cached results).
	OnDrop func(*Session)
}

// Store maps route session ids to sessions.
type Store struct {
	cfg    Config
	lru    *lru.Cache[string, *Session]
	free   []int // free sequence ids
	tokens int   // sum of PastLen
	// committed is the sum of max(Reserved, PastLen): what the sessions
	// hold or were promised; at most MaxTokens.
	committed int
	freeSeq   func(seq int)
	now       func() time.Time

	// Evictions counts sessions evicted by budget or TTL.
	Evictions uint64
	// Admitted counts sessions begun (new, or restarted from position 0);
	// Refused those refused a slot or their reservation; Preemptions the
	// idle sessions dropped so that an admitted session's step could grow;
	// Reprefills the sessions begun again from position 0 after their
	// state was lost here (evicted or preempted) or elsewhere on the route
	// (a restart of a session this store still holds).
	Admitted, Refused, Preemptions, Reprefills uint64
	// lost remembers, boundedly, the sessions dropped by eviction or
	// preemption, so that their return counts as a re-prefill.
	lost *lru.Cache[string, struct{}]
}

// lostMemory bounds the sessions remembered as lost.
const lostMemory = 4096

// New returns a store over sequence ids [0, cfg.MaxSessions). freeSeq drops
// a sequence's KV state in the backend.
func New(cfg Config, freeSeq func(seq int), now func() time.Time) *Store {
	s := &Store{cfg: cfg, freeSeq: freeSeq, now: now}
	s.lru = lru.New[string, *Session](0, nil)
	s.lost = lru.New[string, struct{}](lostMemory, nil)
	for i := cfg.MaxSessions - 1; i >= 0; i-- {
		s.free = append(s.free, i)
	}
	return s
}

// Lookup returns the session id at its current epoch and marks it used.
func (s *Store) Lookup(id string) (*Session, bool) {
	sess, ok := s.lru.Get(id)
	if ok {
		sess.LastUse = s.now()
	}
	return sess, ok
}

// Peek returns the session id without marking it used.
func (s *Store) Peek(id string) (*Session, bool) { return s.lru.Peek(id) }

// CheckEpoch refuses work for an epoch older than the session's.
func (s *Store) CheckEpoch(id string, epoch uint64) error {
	if sess, ok := s.lru.Peek(id); ok && epoch < sess.Epoch {
		return ErrEpochStale
	}
	return nil
}

// Begin returns the session for id at epoch, fresh (PastLen 0), with
// reserve KV tokens promised to it (0: none): an existing session at the
// same or an older epoch is reset (its KV dropped, a newer epoch
// superseding the old state); a new one takes a free sequence. Room for
// either is made by evicting sessions idle for longer than the grace,
// least recently used first; when there is none, it is refused
// (ErrNoSlot, ErrKVBudget: retryable) and nothing changes for a new
// session, while an existing one has lost its state to the restart.
func (s *Store) Begin(id string, epoch uint64, reserve int) (*Session, error) {
	reserve = max(reserve, 0)
	if reserve > s.cfg.MaxTokens || s.cfg.SessionTokens > 0 && reserve > s.cfg.SessionTokens {
		s.Refused++
		return nil, ErrTooLong
	}
	sess, ok := s.lru.Get(id)
	again := ok // a restart from position 0, or the return of a lost session
	if ok {
		if epoch < sess.Epoch {
			return nil, ErrEpochStale
		}
		if epoch > sess.Epoch {
			s.NewEpoch(sess, epoch)
			again = false
		} else {
			s.reset(sess)
		}
		sess.LastUse = s.now()
	} else {
		if len(s.free) == 0 && !s.evictIdle(nil) {
			s.Refused++
			return nil, ErrNoSlot
		}
		seq := s.free[len(s.free)-1]
		s.free = s.free[:len(s.free)-1]
		sess = &Session{ID: id, Epoch: epoch, Seq: seq, LastUse: s.now()}
		s.lru.Put(id, sess, 0)
		_, again = s.lost.Remove(id)
	}
	for s.committed+reserve > s.cfg.MaxTokens {
		if !s.evictIdle(sess) {
			s.Refused++
			if !ok {
				s.drop(sess) // a newcomer leaves no trace
				if again {
					s.lost.Put(id, struct{}{}, 1)
				}
			}
			return nil, ErrKVBudget
		}
	}
	if again {
		s.Reprefills++
	}
	sess.Reserved = reserve
	s.committed += reserve
	s.Admitted++
	return sess, nil
}

// NewEpoch moves sess to a newer epoch: its state is superseded and dropped.
func (s *Store) NewEpoch(sess *Session, epoch uint64) {
	s.reset(sess)
	sess.Epoch = epoch
	sess.HasStep = false
}

// CanAdmit reports whether Begin(id) could succeed now.
func (s *Store) CanAdmit(id string) bool {
	if _, ok := s.lru.Peek(id); ok || len(s.free) > 0 {
		return true
	}
	admit := false
	cutoff := s.evictCutoff()
	s.lru.All(func(_ string, v *Session) bool {
		admit = s.evictable(v, nil, cutoff)
		return !admit
	})
	return admit
}

// evictCutoff is the last use before which an idle session may be evicted.
func (s *Store) evictCutoff() time.Time { return s.now().Add(-s.cfg.EvictGrace) }

// evictable: v is unpinned, not keep, and last used before cutoff (zero:
// any time).
func (s *Store) evictable(v, keep *Session, cutoff time.Time) bool {
	return v.Pins == 0 && v != keep && (cutoff.IsZero() || !v.LastUse.After(cutoff))
}

// Reserve counts n more tokens as held by sess. Past SessionTokens it
// refuses for good (ErrTooLong). Within its reservation they are already
// counted. Past it, room is made from sessions idle for
// longer than the grace and, when preempt is set (sess was admitted
// earlier: a later prefill chunk or a decode step), from any idle session,
// least recently used first (Preemptions). With no room, ErrKVBudget.
func (s *Store) Reserve(sess *Session, n int, preempt bool) error {
	if s.cfg.SessionTokens > 0 && sess.PastLen+n > s.cfg.SessionTokens {
		return ErrTooLong
	}
	grow := max(sess.PastLen+n, sess.Reserved) - max(sess.PastLen, sess.Reserved)
	for s.committed+grow > s.cfg.MaxTokens {
		if s.evictIdle(sess) {
			continue
		}
		if !preempt || !s.preemptIdle(sess) {
			return ErrKVBudget
		}
	}
	s.committed += grow
	s.tokens += n
	sess.PastLen += n
	return nil
}

// Truncate records that sess now holds n tokens (n <= PastLen), after the
// backend rewound it.
func (s *Store) Truncate(sess *Session, n int) {
	if n < sess.PastLen {
		s.committed -= max(sess.PastLen, sess.Reserved) - max(n, sess.Reserved)
		s.tokens -= sess.PastLen - n
		sess.PastLen = n
	}
}

// Committed is the KV tokens held or promised: sum of max(Reserved,
// PastLen) over the sessions.
func (s *Store) Committed() int { return s.committed }

// Release drops id's state. It reports whether there was state to drop;
// releasing nothing is a success. An older epoch than the session's is
// stale and drops nothing.
func (s *Store) Release(id string, epoch uint64) (bool, error) {
	sess, ok := s.lru.Peek(id)
	if !ok {
		return false, nil
	}
	if epoch < sess.Epoch {
		return false, ErrEpochStale
	}
	s.drop(sess)
	return true, nil
}

// Sweep evicts idle sessions unused for longer than the TTL.
func (s *Store) Sweep() {
	if s.cfg.TTL <= 0 {
		return
	}
	cutoff := s.now().Add(-s.cfg.TTL)
	var expired []*Session
	s.lru.All(func(_ string, v *Session) bool {
		if v.Pins == 0 && v.LastUse.Before(cutoff) {
			expired = append(expired, v)
		}
		return true
	})
	for _, v := range expired {
		s.lose(v)
		s.Evictions++
	}
}

// Each calls f for every session, newest use first.
func (s *Store) Each(f func(*Session)) {
	s.lru.All(func(_ string, v *Session) bool { f(v); return true })
}

// Len is the number of sessions holding state; Tokens the KV tokens held.
func (s *Store) Len() int    { return s.lru.Len() }
func (s *Store) Tokens() int { return s.tokens }

// Pressure is the fraction of the KV token budget held or promised.
func (s *Store) Pressure() float64 {
	if s.cfg.MaxTokens == 0 {
		return 0
	}
	return float64(s.committed) / float64(s.cfg.MaxTokens)
}

// preemptIdle drops the least recently used unpinned session other than
// keep, however recently it was used.
func (s *Store) preemptIdle(keep *Session) bool {
	return s.loseOldest(keep, time.Time{}, &s.Preemptions)
}

// lose drops a session the store takes away (eviction, preemption), and
// remembers it.
func (s *Store) lose(sess *Session) {
	s.lost.Put(sess.ID, struct{}{}, 1)
	s.drop(sess)
}

// evictIdle evicts the least recently used unpinned session other than
// keep that has been idle for at least the grace.
func (s *Store) evictIdle(keep *Session) bool {
	return s.loseOldest(keep, s.evictCutoff(), &s.Evictions)
}

// loseOldest drops the least recently used unpinned session other than
// keep, last used before cutoff (zero: any), and counts it in *n.
func (s *Store) loseOldest(keep *Session, cutoff time.Time, n *uint64) bool {
	var victim *Session
	// Walk from the newest; the last one seen is the oldest.
	s.lru.All(func(_ string, v *Session) bool {
		if s.evictable(v, keep, cutoff) {
			victim = v
		}
		return true
	})
	if victim == nil {
		return false
	}
	s.lose(victim)
	*n++
	return true
}

func (s *Store) reset(sess *Session) {
	if sess.PastLen > 0 {
		s.freeSeq(sess.Seq)
	}
	s.committed -= max(sess.PastLen, sess.Reserved)
	s.tokens -= sess.PastLen
	sess.PastLen, sess.Reserved = 0, 0
	sess.PrefillDone = false
}

func (s *Store) drop(sess *Session) {
	if s.cfg.OnDrop != nil {
		s.cfg.OnDrop(sess)
	}
	s.freeSeq(sess.Seq)
	s.committed -= max(sess.PastLen, sess.Reserved)
	s.tokens -= sess.PastLen
	s.lru.Remove(sess.ID)
	s.free = append(s.free, sess.Seq)
}
