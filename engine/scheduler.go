package engine

import (
	"cmp"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/argmax"
	"github.com/meshnet/shardd/internal/lru"
	"github.com/meshnet/shardd/internal/wireerr"
	"github.com/meshnet/shardd/kvcache"
	"github.com/meshnet/shardd/stages/dtype"
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
	queues  map[string]*sessQueue // route session id -> its work, in order
	ring    []*sessQueue          // sessions with work, for round robin
	// spare are emptied queues kept for the next session with work, and
	// decodes and prefills plan's lists, kept between plans: a decode step
	// allocates nothing here (TestPlanDecodeStepAllocs).
	spare             []*sessQueue
	decodes, prefills []*sessQueue
	rr                int
	pending           int

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
	// burst of 32 prompts took 15 iterations of 4 rows to start, PERF.md
	// "A burst's start".)
	decodeOnly      struct{ t, rows ewma }
	sinceDecodeOnly int
	// besideRow is the measured cost of a prefill row beside decode rows:
	// an iteration's time over the decode rows' own (decodeTime), per
	// prefill row. Rows beside decode rows are never priced below it. The
	// cost model's slope alone, fitted over forwards of nearly one size
	// (a decoding session and a few prefill rows), came out low enough
	// now and then to let a whole prefill chunk in beside a decode step:
	// a 500 ms step (PERF.md "A burst's start").
	besideRow ewma
	// budgetRuns and budgetHits count iterations with decode rows and
	// those whose forward kept the decode budget.
	budgetRuns, budgetHits int64
	// dueWaits counts prefill-only iterations not started because a decode
	// step was due before even one prefill token would have finished.
	dueWaits int64
	// preemptions counts prefill-only iterations a decode step stopped.
	preemptions int64
	// prefillTurn alternates decode steps and prefill chunks in the
	// deterministic mode while both wait.
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

// forwardPlan is a planned forward: items are its rows, by work item.
type forwardPlan struct {
	items   []planned // s.planned, valid until the next plan
	rows    int
	decodes int           // sessions whose decode step the iteration took in
	limit   time.Duration // the iteration's time budget (0: none)
	// preemptible: a prefill-only iteration a decode step may stop.
	preemptible bool
}

type sessQueue struct {
	id    string
	items []*work
}

// planned is one item's share of an iteration: rows [from, from+n).
type planned struct {
	w       *work
	from, n int
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
	if cfg.Deterministic && info.MaxSeqs > 0 {
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

// decodeAnchorEvery: one decode iteration in this many runs without
// prefill rows, so the decode budget's anchor stays measured.
const decodeAnchorEvery = 32

// decodeBudget is the time an iteration with rows decode rows may take (0
// while it cannot be known yet, or with no time budget): the set budget,
// or 1.5x the decode rows' own time (decodeTime).
func (s *scheduler) decodeBudget(rows int) time.Duration {
	if b := s.cfg.DecodeBudget; b != 0 {
		return max(b, 0)
	}
	if !s.decodeOnly.t.ok {
		return 0
	}
	t, _ := s.decodeTime(rows)
	return t * 3 / 2
}

// decodeTime is the expected time of a forward of rows decode rows alone:
// the measured time of decode iterations without prefill, moved along the
// cost model's slope when the row count differs; the cost model's line
// while nothing is measured.
func (s *scheduler) decodeTime(rows int) (time.Duration, bool) {
	if !s.decodeOnly.t.ok {
		return s.cost.predict(rows)
	}
	t := s.decodeOnly.t.v
	if _, perRow, ok := s.cost.coef(); ok {
		t += time.Duration(perRow * float64(rows-int(s.decodeOnly.rows.v)) * float64(time.Second))
	}
	return max(t, 0), true
}

// prefillBeside is how many prefill rows fit beside rows decode rows in
// an iteration that may take limit: the time left after the decode rows'
// own (decodeTime), at the cost model's price per row. Pricing the decode
// rows by the line instead (its intercept plus its slope) gave no prefill
// at all once the line's intercept exceeded what a small decode batch
// takes, and a worker whose few decoding sessions kept a step queued
// starved every waiting prompt (PERF.md "Where the ceiling's gap lies").
func (s *scheduler) prefillBeside(rows int, limit time.Duration) int {
	t, ok := s.decodeTime(rows)
	if !ok {
		return 0
	}
	return s.cost.fitAfterAtLeast(t, limit, s.besideRow.v)
}

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

// plan decides the next iteration at now: decode steps first, then
// prefill tokens up to the iteration's budget (orderPrefills). It returns
// the forward to run, if any; refusals and trims it decides are in s.fx,
// and a time to plan again at (a hold) in s.wake.
func (s *scheduler) plan(now time.Time) (forwardPlan, bool) {
	cfg, info := &s.cfg, &s.info
	// Admit each session's head; refused heads are answered and dropped.
	decodes, prefills := s.decodes[:0], s.prefills[:0]
	for i := 0; i < len(s.ring); i++ {
		q := s.ring[i]
		for len(q.items) > 0 {
			switch s.admit(q.items[0]) {
			case admitRun:
				if q.items[0].mode == shardv1.CacheMode_CACHE_MODE_DECODE {
					decodes = append(decodes, q)
				} else {
					prefills = append(prefills, q)
				}
			case admitDrop:
				s.pop(q)
				if len(q.items) == 0 {
					i-- // pop removed q from the ring
				}
				continue
			}
			break
		}
	}
	s.decodes, s.prefills = decodes, prefills // keep what they grew to
	if len(decodes) > 0 {
		decoding := s.gather.decoding(now, cfg.DecodeQuiet)
		if wait := s.gather.hold(now, len(decodes), decoding, cfg.DecodeGroups, cfg.GatherWindow, s.cost.predict); wait > 0 {
			s.wake = now.Add(wait)
			return forwardPlan{}, false
		}
		// A group's share and no more: steps beyond it (the earliest
		// arrivals go first) wait for the next group, so uneven groups
		// (18 and 14 of 32) even out in one trip instead of the smaller
		// one holding its window every time round. Only while the
		// gatherer counts some session as decoding: with none counted
		// (DecodeQuiet negative forgets them at once) there are no
		// groups to keep.
		if g := cfg.DecodeGroups; g > 1 && decoding > 0 {
			if share := (max(decoding, len(decodes)) + g - 1) / g; len(decodes) > share {
				decodes = decodes[:share]
			}
		}
	}
	budget := cfg.PrefillIterationTokens
	var limit time.Duration // the iteration's time budget, when it has one
	switch {
	case len(decodes) > 0:
		rows := 0
		for _, q := range decodes {
			rows += q.items[0].tokens - q.items[0].done
		}
		s.lastDecode, s.lastDecodeRows = now, rows
		limit = s.decodeBudget(rows)
		budget = rows + max(cfg.IterationTokens-rows, s.prefillBeside(rows, limit))
		if (s.sinceDecodeOnly >= decodeAnchorEvery || !s.decodeOnly.t.ok) && cfg.DecodeBudget == 0 {
			budget = rows // measure the decode rows alone now and then
		}
		if s.promptsOutnumber(prefills, len(decodes), now) {
			budget = rows + cfg.PrefillIterationTokens
		}
	case now.Sub(s.lastDecode) < cfg.DecodeQuiet:
		// A decode step is likely on its way: give prefill no more than it
		// would get beside it, and no more than ends before the step is
		// due. When not even one token would, wait for the step: it then
		// runs at once, with prefill tokens beside it.
		budget = max(cfg.IterationTokens, s.prefillBeside(s.lastDecodeRows, s.decodeBudget(s.lastDecodeRows)))
		if s.promptsOutnumber(prefills, 0, now) {
			budget = cfg.PrefillIterationTokens
		} else if due, ok := s.gather.due(now); ok && cfg.DecodeBudget >= 0 {
			if _, ready := s.cost.predict(1); ready {
				n := s.cost.fit(0, due.Sub(now))
				if n == 0 {
					if due.Before(now) {
						due = now
					}
					s.wake = due.Add(dueSlack)
					s.dueWaits++
					return forwardPlan{}, false
				}
				budget = min(budget, n)
			}
		}
	}
	budget = min(budget, info.MaxBatch)
	if cfg.Deterministic {
		// One session's unit of work per forward, whole, round robin over
		// sessions: decode steps and prefill chunks take turns while both
		// wait, so neither starves the other. Its rows then meet the same
		// kernels, in the same shapes, as alone.
		var w *work
		if len(prefills) > 0 && len(decodes) > 0 {
			s.prefillTurn = !s.prefillTurn
			if s.prefillTurn {
				decodes = nil
			}
		}
		if len(decodes) > 0 {
			decodes, prefills = decodes[s.rr%len(decodes):][:1], nil
			w = decodes[0].items[0]
		} else if len(prefills) > 0 {
			prefills = prefills[s.rr%len(prefills):][:1]
			w = prefills[0].items[0]
		}
		s.rr++
		if w != nil {
			budget = min(w.tokens-w.done, info.MaxBatch)
		}
	}

	s.planned = s.planned[:0]
	rows := 0
	for _, q := range decodes {
		w := q.items[0]
		n := w.tokens - w.done
		if rows+n > info.MaxBatch || (rows > 0 && rows+n > max(budget, len(decodes))) {
			continue
		}
		s.planned = append(s.planned, planned{w: w, from: w.done, n: n})
		rows += n
	}
	// The decode rows go in in the order of their sessions' KV sequences,
	// not of their steps' arrival, which changes from step to step. A
	// session's KV cells then lie at a steady stride in the shared buffer,
	// where attention, which reads each row's cells in cell order, runs
	// faster than over cells scattered by arrival order: with 32 sessions
	// decoding together the worker's decode phase went from 0.80 to 0.91
	// of the in-process loop's rate (medians; PERF.md "Decode rows in a
	// steady order").
	slices.SortFunc(s.planned, func(a, b planned) int { return a.w.seq - b.w.seq })

	if len(prefills) > 0 && rows < budget {
		left := budget - rows
		orderPrefills(prefills, now)
		for _, q := range prefills {
			w := q.items[0]
			n := min(w.tokens-w.done, left)
			if n <= 0 {
				break
			}
			s.planned = append(s.planned, planned{w: w, from: w.done, n: n})
			left -= n
			rows += n
		}
	}
	if rows == 0 {
		return forwardPlan{}, false
	}
	for _, p := range s.planned {
		if p.w.started.IsZero() {
			p.w.started = now
			p.w.tm.started = now
		}
	}
	// A decode step that arrives during a prefill-only iteration stops it
	// instead of waiting for it. Not twice in a row: the prefill-only
	// iteration after a preempted one runs to its end, or decode steps
	// arriving every few milliseconds would preempt every prefill
	// iteration, and prompts would never finish while the CPU stays busy
	// (measured: half of all forwards preempted, TTFT 3.5 s, PERF.md
	// "Batches that form"). Nor when the iteration brings more sessions to
	// their first token than there are sessions decoding (that completed
	// a step within the last second): stopping it would hold back more
	// sessions than it serves (the first prompt of a burst came back and
	// stopped the iteration carrying the next 16, PERF.md "A burst's
	// start").
	preemptible := len(decodes) == 0 && !s.preempted
	if preemptible {
		preemptible = s.finishing() <= s.gather.active(now, time.Second)
	}
	s.fwd = forwardPlan{items: s.planned, rows: rows, decodes: len(decodes), limit: limit, preemptible: preemptible}
	return s.fwd, true
}

// promptsOutnumber reports whether an iteration of PrefillIterationTokens
// prompt tokens (in orderPrefills' order) would bring more sessions to
// their first token than there are sessions decoding: those with a step in
// this iteration (decodes) or that completed one within the last second.
// Then the decode budget gives way for the iteration: it protects the
// decoding few at the cost of the waiting many. Without this, a few
// sessions decoding in small, fast batches kept the budget for prompt rows
// beside them near zero, and their steps, always due within a millisecond,
// kept prefill-only iterations from starting: at 32 sessions the median
// time to an 8-token prompt's first token was 9.4 s (PERF.md "Prompts that outnumber the
// decoding sessions").
func (s *scheduler) promptsOutnumber(prefills []*sessQueue, decodes int, now time.Time) bool {
	if s.cfg.Deterministic || len(prefills) <= decodes {
		return false
	}
	decoding := max(decodes, s.gather.active(now, time.Second))
	if len(prefills) <= decoding {
		return false
	}
	orderPrefills(prefills, now)
	left, first := s.cfg.PrefillIterationTokens, 0
	for _, q := range prefills {
		if left <= 0 {
			break
		}
		w := q.items[0]
		need := w.tokens - w.done
		if need <= left && w.mode == shardv1.CacheMode_CACHE_MODE_PREFILL && w.final {
			first++
		}
		left -= min(need, left)
	}
	return first > decoding
}

// finishing counts the planned items that complete a prompt: after them
// their sessions decode.
func (s *scheduler) finishing() int {
	n := 0
	for _, p := range s.planned {
		if w := p.w; w.mode == shardv1.CacheMode_CACHE_MODE_PREFILL && w.final && p.from+p.n == w.tokens {
			n++
		}
	}
	return n
}

// forwardOutcome is what became of a planned forward: how long it took, its
// error, and the backend's output for its rows (read by advance only).
type forwardOutcome struct {
	took time.Duration
	err  error
	out  *backend.Output
}

// prefillPatience: a prefill chunk queued for longer than this goes ahead
// of shorter ones (orderPrefills).
const prefillPatience = time.Second

// orderPrefills puts the prefill chunks that wait in the order an
// iteration's prefill tokens go to them: the fewest tokens left first, in
// order of arrival among equals, so the tokens that bring a session to its
// first token soonest go first; but a chunk queued for longer than
// prefillPatience goes ahead, oldest first, so a long prompt is not passed
// over for ever by short ones. Shares split equally among all waiting
// chunks (the order before) made a burst of short prompts all finish
// together, late; in order, the first of them decode sooner (median TTFT
// at 16 sessions 200 to 86 ms), though the last still waits for every
// prompt token before it (PERF.md "Where the ceiling's gap lies").
func orderPrefills(prefills []*sessQueue, now time.Time) {
	slices.SortStableFunc(prefills, func(a, b *sessQueue) int {
		wa, wb := a.items[0], b.items[0]
		oldA, oldB := now.Sub(wa.queued) > prefillPatience, now.Sub(wb.queued) > prefillPatience
		switch {
		case oldA != oldB:
			if oldA {
				return -1
			}
			return 1
		case !oldA:
			if c := cmp.Compare(wa.tokens-wa.done, wb.tokens-wb.done); c != 0 {
				return c
			}
		}
		return wa.queued.Compare(wb.queued)
	})
}

// advance takes in the outcome of the planned forward: the cost model,
// then the rows' outputs (or a rewind after a preemption, or the failure).
// The items it completes or fails are answered in s.fx.
func (s *scheduler) advance(o forwardOutcome) {
	run, took, err := s.fwd, o.took, o.err
	if err == nil {
		if run.rows <= costMaxRows {
			s.cost.add(run.rows, took)
		}
		if run.decodes > 0 {
			s.sinceDecodeOnly++
			if run.rows == s.lastDecodeRows {
				s.sinceDecodeOnly = 0
				s.decodeOnly.t.add(took)
				s.decodeOnly.rows.add(time.Duration(run.rows))
			} else if alone, ok := s.decodeTime(s.lastDecodeRows); ok && s.decodeOnly.t.ok {
				s.besideRow.add(max(took-alone, 0) / time.Duration(run.rows-s.lastDecodeRows))
			}
		}
		if run.limit > 0 {
			s.budgetRuns++
			if took <= run.limit {
				s.budgetHits++
			}
		}
	}
	switch {
	case errors.Is(err, backend.ErrPreempted):
		s.rewindPlanned()
		s.preemptions++
		s.preempted = true
		return
	case err != nil:
		s.failPlanned(err)
		return
	}
	if run.decodes == 0 {
		s.preempted = false // a prefill-only iteration ran to its end
	}
	s.distribute(o.out)
}

// rewindPlanned undoes a preempted iteration: every planned item goes back
// to where it stood before it (its rows are run again later).
func (s *scheduler) rewindPlanned() {
	for _, p := range s.planned {
		s.fx.trim(p.w.seq, p.w.first+p.w.done)
	}
}

// distribute copies each planned item's outputs from out and completes
// finished items.
func (s *scheduler) distribute(out *backend.Output) {
	info := &s.info
	h, vocab := info.Hidden, info.Vocab
	row, logitRow := 0, 0
	for _, p := range s.planned {
		w := p.w
		if w.out == nil {
			w.out = s.pool.Alloc(s.outBytes(w))
			w.out.Truncate(0)
		}
		buf := w.out.Bytes()
		if info.LogitsOut {
			nOut := 0
			for r := p.from; r < p.from+p.n; r++ {
				if w.rowWantsOutput(r) {
					nOut++
				}
			}
			rows := out.Logits[logitRow*vocab : (logitRow+nOut)*vocab]
			if w.topK > 0 {
				buf = s.appendTop(w, buf, rows)
			} else {
				buf = dtype.AppendF32Bytes(buf, rows)
			}
			logitRow += nOut
			w.outRows += nOut
		} else {
			rows := out.Hidden[row*h : (row+p.n)*h]
			if s.cfg.Boundary == shardv1.DType_DTYPE_FLOAT32 {
				buf = dtype.AppendF32Bytes(buf, rows)
			} else {
				buf = dtype.AppendF32ToBF16(buf, rows)
			}
			w.outRows += p.n
		}
		w.out.SetLen(len(buf)) // appended in place: outBytes sized the buffer
		row += p.n
		w.done += p.n
		if w.done == w.tokens {
			s.complete(w)
		}
	}
}

// appendTop appends the compact output of logits rows (vocab wide): each
// row's K best logits to buf, their ids to w.topIDs (complete puts them
// after the values).
func (s *scheduler) appendTop(w *work, buf []byte, rows []float32) []byte {
	vocab := s.info.Vocab
	for r := 0; r+vocab <= len(rows); r += vocab {
		row := rows[r : r+vocab]
		s.topIdx, s.topHeap = argmax.TopK(s.topIdx, s.topHeap, row, w.topK)
		for _, id := range s.topIdx {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(row[id]))
		}
		w.topIDs = append(w.topIDs, s.topIdx...)
	}
	return buf
}

// outBytes is the size of w's whole output.
func (s *scheduler) outBytes(w *work) int {
	if s.info.LogitsOut && w.topK > 0 {
		return 8 * w.outputRows() * w.topK
	}
	if s.info.LogitsOut {
		return 4 * w.outputRows() * s.info.Vocab
	}
	return dtype.Size(s.cfg.Boundary) * w.tokens * s.info.Hidden
}

// complete records a finished item and sends its result.
func (s *scheduler) complete(w *work) {
	now := s.now()
	w.releaseInput()
	r := newResult(resultFields{
		workID: w.workID, session: w.st.id, step: w.step, epoch: w.epoch,
		phase: w.phase, mode: w.mode, first: w.first, tokens: w.tokens, chunk: w.chunk, deadline: w.deadline,
		body: w.out, outPos: w.outPos, execNanos: uint64(now.Sub(w.started)), cacheHit: w.hit,
		tm: w.tm, bytesIn: w.bytesIn,
	})
	if s.timing {
		r.tm.completed = now
	}
	w.out = nil
	if s.info.LogitsOut && w.topK > 0 {
		// The values, then the ids: sendResult frames them as two tensors.
		buf := r.body.Bytes()
		for _, id := range w.topIDs {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(id))
		}
		r.body.SetLen(len(buf))
		r.name, r.dtype, r.shape = nameTopValues, shardv1.DType_DTYPE_FLOAT32, [2]int64{int64(w.outRows), int64(w.topK)}
		r.outPos, r.topK = nil, w.topK
	} else if s.info.LogitsOut {
		r.name, r.dtype, r.shape = nameLogits, shardv1.DType_DTYPE_FLOAT32, [2]int64{int64(w.outRows), int64(s.info.Vocab)}
		r.outPos = nil
	} else {
		r.name, r.dtype, r.shape = nameHidden, s.cfg.Boundary, [2]int64{int64(w.tokens), int64(s.info.Hidden)}
	}
	if w.mode == shardv1.CacheMode_CACHE_MODE_STATELESS {
		s.fx.trim(s.scratch, 0)
		s.owner = nil
	} else {
		sess := w.sess
		sess.LastStep, sess.HasStep = w.step, true
		if w.mode == shardv1.CacheMode_CACHE_MODE_PREFILL {
			sess.PrefillDone = w.final
		}
		if w.mode == shardv1.CacheMode_CACHE_MODE_DECODE || sess.PrefillDone {
			s.gather.done(w.st.id, now)
		}
		r.pastLen = uint64(sess.PastLen)
		s.results.Put(resultKey{w.st.id, w.epoch, w.step}, r.ref(), r.cost())
		s.keepRecent(sess, kvcache.StepRef{Epoch: w.epoch, Step: w.step})
	}
	s.fx.deliver(w.st, reply{res: r}, true)
	s.finish(w)
}

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
	for _, old := range sess.Results {
		if r, ok := s.results.Remove(resultKey{sess.ID, old.Epoch, old.Step}); ok {
			r.release()
		}
	}
	sess.Results = sess.Results[:0]
}

// finish pops w (the head of its session's queue).
func (s *scheduler) finish(w *work) {
	if q := s.queues[w.st.id]; q != nil && len(q.items) > 0 && q.items[0] == w {
		s.pop(q)
	}
	s.retire(w)
}

// failPlanned answers every planned item with err after a failed forward and
// rewinds the sessions to where each item began.
func (s *scheduler) failPlanned(err error) {
	werr := wireerr.Wrap(ErrForward, err)
	if errors.Is(err, backend.ErrKVFull) {
		werr = ErrKVFull
	}
	seen := map[*work]bool{}
	for _, p := range s.planned {
		if seen[p.w] {
			continue
		}
		seen[p.w] = true
		s.fail(p.w, werr)
	}
}

// fail answers an admitted item with err, undoing its KV reservation.
func (s *scheduler) fail(w *work, err error) {
	if w.mode == shardv1.CacheMode_CACHE_MODE_STATELESS {
		s.fx.trim(s.scratch, 0)
		s.owner = nil
	} else if w.sess != nil {
		s.fx.trim(w.seq, w.first)
		s.store.Truncate(w.sess, w.first)
	}
	s.refuse(w, err)
	s.finish(w)
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

// cancel answers queued work of session id (one work id, or all) with
// CANCELLED. An item already partly run is rewound. It returns how many
// items were cancelled.
func (s *scheduler) cancel(id string, epoch uint64, workID string) int {
	q := s.queues[id]
	if q == nil {
		return 0
	}
	n := 0
	kept := q.items[:0]
	for _, w := range q.items {
		if (workID != "" && w.workID != workID) || w.epoch < epoch {
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
		s.cancel(q.id, 0, "")
	}
	for s.results.EvictOldest() {
	}
}
