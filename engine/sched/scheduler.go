// Package sched is the scheduler's pure core: the state that decides what
// the backend runs, as etcd's raft is built. It holds the session queues,
// admission against the session store (kvcache), the results cache that
// answers duplicates, the prefix cache's index, the cost model, the decode
// budget and the gathering rule; it knows sessions by their id and items
// by a handle (Item.Owner), and time only as the now each call is given.
// It changes only in Enqueue, Plan(now), Advance(now, outcome) and the
// control calls (Cancel, Release, Sweep, Shutdown); each records what it
// asks of the world (replies, trims, prefix saves and loads, retired items)
// in Effects instead of doing it, and Stats reports its figures. The
// engine's driver, one goroutine, runs the planned forward on the backend
// and carries out the effects. The package imports neither gRPC nor the
// backend (TestImports), so its scenarios are short scripts with no
// goroutine, no sleep and no llama.cpp (testdata/).
package sched

import (
	"time"

	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/internal/lru"
	"github.com/meshnet/shardd/kvcache"
)

// Config is what the scheduler is told of the worker's settings; the
// engine's Config documents each (its flags).
type Config struct {
	Exact                                   bool
	MaxSessions                             int
	SessionTTL, EvictGrace                  time.Duration
	ResultsCacheBytes                       int64
	MaxInflightChunks                       uint32
	IterationTokens, PrefillIterationTokens int
	DecodeBudget, DecodeQuiet, GatherWindow time.Duration
	DecodeGroups                            int
}

// Info is what the scheduler is told of the backend.
type Info struct {
	MaxSeqs   int  // backend sequences; the last is the scratch sequence
	CtxTokens int  // the KV cache's cells
	MaxBatch  int  // rows a forward may hold
	LogitsOut bool // the shard produces logits (the last shard)
}

// Scheduler is the state that decides what the backend runs. It holds no
// backend, no engine and no clock: Plan and Advance change it and record
// what they ask of the world in its Effects, which its driver carries out.
// All of it belongs to one goroutine, the driver's.
type Scheduler struct {
	cfg   Config
	info  Info
	pool  *bufpool.Pool
	hooks Hooks
	// at is the time the current call was given (the session store's
	// clock too).
	at time.Time

	store   *kvcache.Store
	results *lru.Cache[resultKey, Output]
	// prefix is the prefix cache; nil when off or when the backend cannot
	// copy KV state.
	prefix *prefixCache
	// loadFailed: a prefix load of the planned forward did not fit; the
	// forward must not run (its rows assumed the load).
	loadFailed bool
	queues     map[string]*sessQueue // route session id -> its items, in order
	ring       []*sessQueue          // sessions with work, for round robin
	// spare are emptied queues kept for the next session with work, and
	// decodes and prefills plan's lists, kept between plans: a decode step
	// allocates nothing here (engine's TestDecodeStepAllocs).
	spare             []*sessQueue
	decodes, prefills []*sessQueue
	rr                int
	pending           int
	// together: the exact mode's prompt chunks of one forward.
	together []*sessQueue

	planned []Planned
	scratch int   // the sequence kept for Stateless work
	owner   *Item // the Stateless item holding scratch
	// lastDecode is when a decode step last ran. Until DecodeQuiet after
	// it, prefill-only iterations stay small too, so a decode step that
	// arrives between steps never waits behind a long prefill iteration.
	lastDecode time.Time
	// lastDecodeRows is how many decode rows that iteration had: the
	// prefill-only iterations within DecodeQuiet after it are kept to the
	// prefill share an iteration with those rows would have.
	lastDecodeRows int
	cost           costModel
	// decodeOnly is the last forwards with decode rows and no prefill
	// rows: their time anchors the decode budget (the model's line is
	// only used to adjust it for another row count). sinceDecodeOnly
	// counts decode iterations since one ran; the first decode iteration
	// and every decodeAnchorEvery-th after run without prefill, to take
	// the anchor and keep it fresh. (Until the first, the budget was
	// unknown and prefill beside decode rows got IterationTokens only: a
	// burst of 32 prompts took 15 iterations of 4 rows to start.)
	decodeOnly      struct{ t, rows ewma }
	sinceDecodeOnly int
	// besideRow is the measured cost of a prefill row beside decode rows:
	// an iteration's time over the decode rows' own (decodeTime), per
	// prefill row. Rows beside decode rows are never priced below it. The
	// cost model's slope alone, fitted over forwards of nearly one size
	// (a decoding session and a few prefill rows), came out low enough
	// now and then to let a whole prefill chunk in beside a decode step:
	// a 500 ms step.
	besideRow ewma
	// besideStarved counts decode iterations in a row that waiting prompts
	// got no row beside at besideRow's price; besideProbes the iterations
	// that took rows anyway to measure it again (besideBudget).
	besideStarved int
	besideProbes  int64
	probing       bool  // the iteration being planned is a probe
	crowds        int64 // iterations whose prompt budget a crowd set (crowd)
	// budgetRuns and budgetHits count iterations with decode rows and
	// those whose forward kept the decode budget.
	budgetRuns, budgetHits int64
	// dueWaits counts prefill-only iterations not started because a decode
	// step was due before even one prefill token would have finished.
	dueWaits int64
	// preemptions counts prefill-only iterations a decode step stopped.
	preemptions int64
	// prefillTurn alternates decode steps and prefill chunks in the
	// exact mode while both wait.
	prefillTurn bool
	// preempted: the last prefill-only iteration was preempted, so the
	// next one runs to its end.
	preempted bool
	// gather holds decode iterations until a share of the decoding
	// sessions is ready; wake is when the current hold ends (zero: none).
	gather gatherer
	wake   time.Time

	// fx are the effects of the last state change, which the driver
	// carries out: what the scheduler decides never waits on I/O.
	fx Effects
	// fwd is the forward the last plan asked for.
	fwd Forward
}

type sessQueue struct {
	id    string
	items []*Item
}

// resultKey identifies a step's output for duplicate answers.
type resultKey struct {
	session string
	epoch   uint64
	step    uint64
}

// New makes the state for a backend described by info under cfg (with
// the engine's defaults applied), at now; outputs answered from the
// prefix cache take their buffers from pool.
func New(cfg Config, info Info, pool *bufpool.Pool, hooks Hooks, now time.Time) *Scheduler {
	s := &Scheduler{cfg: cfg, info: info, pool: pool, hooks: hooks, at: now}
	s.scratch = info.MaxSeqs - 1
	sessionTokens := 0
	if cfg.Exact && info.MaxSeqs > 0 {
		sessionTokens = info.CtxTokens / info.MaxSeqs // a KV stream per sequence
	}
	s.store = kvcache.New(kvcache.Config{
		MaxSessions:   cfg.MaxSessions,
		MaxTokens:     info.CtxTokens,
		SessionTokens: sessionTokens,
		TTL:           cfg.SessionTTL,
		EvictGrace:    max(cfg.EvictGrace, 0),
		OnDrop:        s.dropResults,
	}, func(seq int) { s.fx.trim(seq, 0) }, func() time.Time { return s.at })
	s.results = lru.New[resultKey, Output](cfg.ResultsCacheBytes, func(_ resultKey, r Output) { r.Release() })
	s.queues = map[string]*sessQueue{}
	return s
}

// Store is the session store, for the driver's own reads (Health, the
// invariants check) on the scheduler's goroutine.
func (s *Scheduler) Store() *kvcache.Store { return s.store }

// Effects are what the calls since the last Reset decided.
func (s *Scheduler) Effects() *Effects { return &s.fx }

// Pending is how many items are queued (running ones included).
func (s *Scheduler) Pending() int { return s.pending }

// Wake is when a hold the last Plan decided ends (zero: none).
func (s *Scheduler) Wake() time.Time { return s.wake }

// ClearWake forgets the hold: the driver plans again.
func (s *Scheduler) ClearWake() { s.wake = time.Time{} }

// Each calls f for every queued item, running ones included.
func (s *Scheduler) Each(f func(*Item)) {
	for _, q := range s.queues {
		for _, it := range q.items {
			f(it)
		}
	}
}

// Enqueue queues an item at now behind its session's earlier ones.
func (s *Scheduler) Enqueue(it *Item, now time.Time) {
	s.at = now
	q := s.queues[it.Session]
	if q == nil {
		if n := len(s.spare); n > 0 {
			q, s.spare = s.spare[n-1], s.spare[:n-1]
		} else {
			q = new(sessQueue)
		}
		q.id = it.Session
		s.queues[it.Session] = q
	}
	if len(q.items) == 0 {
		s.ring = append(s.ring, q)
	}
	q.items = append(q.items, it)
	s.pending++
	it.Queued = now
	switch it.Mode {
	case Decode:
		s.gather.arrived(it.Session, now)
	case Prefill:
		s.gather.prompted(it.Session)
	}
	if sess, ok := s.store.Peek(it.Session); ok {
		s.pin(it, sess) // queued work keeps its session from eviction
	}
}

// pin makes w hold a pin on sess (moving it from another session object,
// one that was released and begun again since w was queued).
func (s *Scheduler) pin(w *Item, sess *kvcache.Session) {
	if w.pin == sess {
		return
	}
	s.unpin(w)
	sess.Pins++
	w.pin = sess
}

func (s *Scheduler) unpin(w *Item) {
	if w.pin != nil {
		w.pin.Pins--
		w.pin = nil
	}
}

// retire is where every submitted item ends, answered: its pin and its
// place in the queue count go.
func (s *Scheduler) retire(w *Item) {
	s.unpin(w)
	s.fx.Retired = append(s.fx.Retired, w)
}

// pop removes q's head (finished or refused). The rest move up, so the
// queue keeps its array (it holds a few items: the stream's credits).
func (s *Scheduler) pop(q *sessQueue) {
	n := copy(q.items, q.items[1:])
	q.items[n] = nil
	q.items = q.items[:n]
	s.pending--
	if len(q.items) == 0 {
		s.dropQueue(q)
	}
}
