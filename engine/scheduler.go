package engine

import (
	"time"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/lru"
	"github.com/meshnet/shardd/kvcache"
)

// scheduler is the state that decides what the backend runs: the session
// queues, admission against the session store, the results cache, the cost
// model, the decode budget and the gathering rule. It holds no backend, no
// engine and no clock of its own: plan and advance change it and record
// what they ask of the world in fx, which its driver (driver.go) carries
// out. All of its fields belong to the driver's goroutine.
type scheduler struct {
	cfg  Config
	info backend.Info
	pool *bufpool.Pool
	// topIdx and topHeap are appendTop's scratch (compact output).
	topIdx, topHeap []int32
	// timing: completed results carry their completion time (tracing on).
	timing bool

	store   *kvcache.Store
	results *lru.Cache[resultKey, *result]
	// prefix is the prefix cache; nil when off or when the backend cannot
	// copy KV state.
	prefix *prefixCache
	// loadFailed: a prefix load of the planned forward did not fit; the
	// forward must not run (its rows assumed the load).
	loadFailed bool
	queues     map[string]*sessQueue // route session id -> its work, in order
	ring       []*sessQueue          // sessions with work, for round robin
	// spare are emptied queues kept for the next session with work, and
	// decodes and prefills plan's lists, kept between plans: a decode step
	// allocates nothing here (TestPlanDecodeStepAllocs).
	spare             []*sessQueue
	decodes, prefills []*sessQueue
	rr                int
	pending           int
	// together: the exact mode's prompt chunks of one forward.
	together []*sessQueue

	planned []planned
	scratch int   // the sequence kept for STATELESS work
	owner   *work // the STATELESS item holding scratch
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
	probing       bool // the iteration being planned is a probe
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

	// clock is the scheduler's time (time.Now; a script's clock in tests).
	clock func() time.Time
	// fx are the effects of the last state change, which the driver
	// carries out (apply): what the scheduler decides never waits on I/O.
	fx effects
	// fwd is the forward the last plan asked for.
	fwd forwardPlan
}

type sessQueue struct {
	id    string
	items []*work
}

// init makes the state for a backend described by info under cfg (with
// its defaults applied); output buffers come from pool.
func (s *scheduler) init(cfg Config, info backend.Info, pool *bufpool.Pool, timing bool) {
	s.cfg, s.info, s.pool, s.timing = cfg, info, pool, timing
	if s.clock == nil {
		s.clock = time.Now
	}
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
	}, func(seq int) { s.fx.trim(seq, 0) }, s.now)
	s.results = newResultsCache(cfg.ResultsCacheBytes)
	s.queues = map[string]*sessQueue{}
}

// now is the scheduler's clock.
func (s *scheduler) now() time.Time { return s.clock() }

func (s *scheduler) enqueue(w *work) {
	q := s.queues[w.st.id]
	if q == nil {
		if n := len(s.spare); n > 0 {
			q, s.spare = s.spare[n-1], s.spare[:n-1]
		} else {
			q = new(sessQueue)
		}
		q.id = w.st.id
		s.queues[w.st.id] = q
	}
	if len(q.items) == 0 {
		s.ring = append(s.ring, q)
	}
	q.items = append(q.items, w)
	s.pending++
	w.queued = s.now()
	if w.mode == shardv1.CacheMode_CACHE_MODE_DECODE {
		s.gather.arrived(w.st.id, w.queued)
	}
	if sess, ok := s.store.Peek(w.st.id); ok {
		s.pin(w, sess) // queued work keeps its session from eviction
	}
}

// pin makes w hold a pin on sess (moving it from another session object,
// one that was released and begun again since w was queued).
func (s *scheduler) pin(w *work, sess *kvcache.Session) {
	if w.pin == sess {
		return
	}
	s.unpin(w)
	sess.Pins++
	w.pin = sess
}

func (s *scheduler) unpin(w *work) {
	if w.pin != nil {
		w.pin.Pins--
		w.pin = nil
	}
}

// retire is where every submitted item ends, answered: its pin and its
// place in the queue count go.
func (s *scheduler) retire(w *work) {
	s.unpin(w)
	s.fx.retired = append(s.fx.retired, w)
}

// pop removes q's head (finished or refused). The rest move up, so the
// queue keeps its array (it holds a few items: the stream's credits).
func (s *scheduler) pop(q *sessQueue) {
	n := copy(q.items, q.items[1:])
	q.items[n] = nil
	q.items = q.items[:n]
	s.pending--
	if len(q.items) == 0 {
		s.dropQueue(q)
	}
}
