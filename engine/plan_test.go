package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/race"
)

// script drives the scheduler by hand, with no goroutine, no llama.cpp and
// no clock but its own: it submits work to the state, asks it for a plan
// at a time it chooses, has the driver run the planned forward on the fake
// backend, tells the state how long the forward took, and reads the
// replies the state decided. Each scenario below is a few lines of it.
type script struct {
	t       *testing.T
	e       *Engine
	s       *scheduler
	d       *driver
	fp      forwardPlan // the last plan
	fb      *fakeBackend
	now     time.Time
	streams map[string]*stream
	next    map[string]*progress
}

// progress is what the script has sent for one session.
type progress struct {
	step uint64
	pos  int
}

// newScript makes a first-shard scheduler (token ids in, hidden states out)
// over the fake backend, with edit applied to the fake's limits.
func newScript(t *testing.T, cfg Config, edit func(*backend.Info)) *script {
	fb := newFake(true, false)
	if edit != nil {
		edit(&fb.Shape)
	}
	if cfg.EvictGrace == 0 {
		cfg.EvictGrace = -1
	}
	e := &Engine{cfg: cfg.Defaults().forBackend(fb.Shape), be: fb, info: fb.Shape, pool: bufpool.Default, log: quietLog()}
	e.initObserver(nil, nil)
	sc := &script{t: t, e: e, s: &e.sched, d: &e.drv, fb: fb, now: time.Unix(1_000_000, 0), streams: map[string]*stream{}, next: map[string]*progress{}}
	sc.s.clock = func() time.Time { return sc.now }
	sc.s.init(e.cfg, e.info, e.pool, e.obs.on)
	if err := sc.d.init(e); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sc.d.shutdown()
		for _, st := range sc.streams {
			st.close()
		}
	})
	return sc
}

// stream returns session id's stream, made on first use.
func (sc *script) stream(id string) *stream {
	if st, ok := sc.streams[id]; ok {
		return st
	}
	ctx, cancel := context.WithCancel(context.Background())
	st := &stream{e: sc.e, id: id, epoch: 1, fc: limits{inflight: 64}, ctx: ctx, cancel: cancel,
		replies: make(chan reply, 256), sendDone: make(chan struct{})}
	close(st.sendDone) // no sender: the script reads replies itself
	sc.streams[id] = st
	sc.next[id] = &progress{}
	return st
}

// submit queues a unit of work of session id: a prefill chunk of n tokens
// (final), or a decode step when n is 0.
func (sc *script) submit(id string, n int) {
	w := sc.make(id, n)
	sc.queue(w)
}

// queue takes a credit for w on its stream and hands it to the state.
func (sc *script) queue(w *work) {
	if err := w.st.admitWork(); err != nil {
		sc.t.Fatal(err)
	}
	sc.e.queued.Add(1)
	sc.s.enqueue(w)
}

// make builds session id's next unit of work (as submit) without queueing it.
func (sc *script) make(id string, n int) *work {
	st, p := sc.stream(id), sc.next[id]
	if sc.next[id] == nil {
		p = &progress{}
		sc.next[id] = p
	}
	p.step++
	w := &work{st: st, workID: fmt.Sprintf("%s/%d", id, p.step), step: p.step, epoch: 1, first: p.pos, final: true}
	if n == 0 {
		w.mode, w.phase, w.tokens, w.expected = shardv1.CacheMode_CACHE_MODE_DECODE, shardv1.Phase_PHASE_DECODE, 1, uint64(p.pos)
	} else {
		w.mode, w.phase, w.tokens = shardv1.CacheMode_CACHE_MODE_PREFILL, shardv1.Phase_PHASE_PREFILL, n
	}
	w.tokenIDs = make([]int32, w.tokens)
	p.pos += w.tokens
	return w
}

// plan asks for the next iteration now and describes it: "a:d1 b:p7"
// (session, decode or prefill, rows), or "wait 3ms" (a hold until the
// scheduler's wake time), or "idle".
func (sc *script) plan() string {
	sc.s.wake = time.Time{}
	fp, run := sc.s.plan(sc.now)
	sc.d.apply()
	sc.fp = fp
	if !run {
		if !sc.s.wake.IsZero() {
			return fmt.Sprintf("wait %v", sc.s.wake.Sub(sc.now))
		}
		return "idle"
	}
	var parts []string
	for _, p := range fp.items {
		kind := "p"
		if p.w.mode == shardv1.CacheMode_CACHE_MODE_DECODE {
			kind = "d"
		}
		parts = append(parts, fmt.Sprintf("%s:%s%d", p.w.st.id, kind, p.n))
	}
	return strings.Join(parts, " ")
}

// Forwards in a script take costBase + costRow per row (the model the
// scheduler fits online), unless a step says otherwise.
const (
	costBase = 2 * time.Millisecond
	costRow  = 500 * time.Microsecond
)

// run runs the planned forward on the fake and advances the scheduler as
// if it took took (0: the script's cost line); the clock moves on by it.
func (sc *script) run(took time.Duration) {
	if took == 0 {
		took = costBase + time.Duration(sc.fp.rows)*costRow
	}
	_, err := sc.d.forward(sc.fp)
	sc.now = sc.now.Add(took)
	sc.s.advance(forwardOutcome{took: took, err: err, out: &sc.d.out})
	sc.d.apply()
	sc.d.publish(sc.fp.rows)
}

// step plans and, when there is a forward, runs it taking took (0: the
// cost line); it returns the plan.
func (sc *script) step(took time.Duration) string {
	p := sc.plan()
	if !strings.HasPrefix(p, "wait") && p != "idle" {
		sc.run(took)
	}
	return p
}

// replies describes and releases what session id has been answered since
// the last call: "ack 1" (step 1 done), "dup 2", "CANCELLED 3".
func (sc *script) replies(id string) string {
	st := sc.streams[id]
	var out []string
	for {
		select {
		case r := <-st.replies:
			switch {
			case r.res != nil && r.duplicate:
				out = append(out, fmt.Sprintf("dup %d", r.res.step))
			case r.res != nil:
				out = append(out, fmt.Sprintf("ack %d", r.res.step))
			case r.status != nil:
				out = append(out, fmt.Sprintf("%s %d", strings.TrimPrefix(r.status.Error.GetCode().String(), "ERROR_CODE_"), r.status.IdempotencyStep))
			case r.ack != nil:
				out = append(out, fmt.Sprintf("dup-ack %d", r.ack.IdempotencyStep))
			}
			r.release()
		default:
			return strings.Join(out, ", ")
		}
	}
}

// expect fails unless got is want.
func (sc *script) expect(what, got, want string) {
	sc.t.Helper()
	if got != want {
		sc.t.Fatalf("%s: got %q, want %q", what, got, want)
	}
}

// prefilled runs a one-chunk prefill of n tokens for each session and
// reads its acks, leaving them ready to decode.
func (sc *script) prefilled(n int, ids ...string) {
	sc.t.Helper()
	for _, id := range ids {
		sc.submit(id, n)
	}
	for range 64 {
		if sc.s.pending == 0 {
			break
		}
		sc.step(0)
	}
	for _, id := range ids {
		sc.expect(id+" prefill", sc.replies(id), fmt.Sprintf("ack %d", sc.next[id].step))
	}
}

// decodeEveryMs has session id decode costMinRuns steps alone, each sent
// 1 ms after the last one completed (the trip round the rest of the route
// and the head), so the cost model and the session's gap are known.
func (sc *script) decodeEveryMs(id string) {
	sc.t.Helper()
	for i := range costMinRuns {
		sc.submit(id, 0)
		sc.expect(fmt.Sprint("decode ", i), sc.step(0), id+":d1")
		sc.replies(id)
		sc.now = sc.now.Add(time.Millisecond)
	}
}

// An iteration's prefill tokens go to the chunks with the fewest tokens
// left first, in order of arrival among equals, so sessions reach their
// first token one after another instead of all together at the end.
func TestPlanPrefillShortestFirst(t *testing.T) {
	sc := newScript(t, Config{PrefillIterationTokens: 12, DecodeQuiet: -1}, nil)
	sc.submit("a", 10)
	sc.submit("b", 4)
	sc.submit("c", 10)
	sc.expect("1st", sc.step(time.Millisecond), "b:p4 a:p8")
	sc.expect("b", sc.replies("b"), "ack 1")
	// a has 2 left: it goes first.
	sc.expect("2nd", sc.step(time.Millisecond), "a:p2 c:p10")
	for _, id := range []string{"a", "c"} {
		sc.expect(id, sc.replies(id), "ack 1")
	}
	sc.expect("after", sc.plan(), "idle")
}

// A chunk queued for longer than prefillPatience goes ahead of shorter
// ones, so short prompts arriving all the time cannot pass a long one
// over for ever.
func TestPlanPrefillPatience(t *testing.T) {
	sc := newScript(t, Config{PrefillIterationTokens: 8, DecodeQuiet: -1}, nil)
	sc.submit("long", 100)
	var got []string
	start := sc.now
	for i := 0; sc.now.Sub(start) <= prefillPatience; i++ {
		id := fmt.Sprint("s", i)
		sc.submit(id, 8)
		got = append(got, sc.step(100*time.Millisecond))
		sc.expect(id, sc.replies(id), "ack 1")
	}
	// Until then the short ones went first, whole.
	for i, p := range got {
		sc.expect(fmt.Sprint("short ", i), p, fmt.Sprintf("s%d:p8", i))
	}
	sc.submit("late", 8)
	sc.expect("patience spent", sc.step(100*time.Millisecond), "long:p8")
}

// Decode steps go first; prefill tokens fill the iteration up to
// IterationTokens beside them (no time budget).
func TestPlanDecodeFirstPrefillBeside(t *testing.T) {
	sc := newScript(t, Config{IterationTokens: 8, DecodeGroups: -1, DecodeBudget: -1}, nil)
	sc.prefilled(3, "a")
	sc.submit("a", 0)
	sc.submit("b", 20)
	sc.expect("mixed", sc.step(time.Millisecond), "a:d1 b:p7")
	sc.expect("a", sc.replies("a"), "ack 2")
	// With no decode step waiting but one just run, prefill stays at the
	// share it would have beside the decode step (DecodeQuiet).
	sc.expect("quiet", sc.step(time.Millisecond), "b:p8")
}

// Prefill rows beside decode rows are priced at no less than they were
// measured to cost there. A cost model fitted over forwards of nearly one
// size can come out with a slope far too low, and alone it would let a
// whole chunk in beside a decode step.
func TestPlanBesideRowsPricedAsMeasured(t *testing.T) {
	var s scheduler
	for i := range 40 {
		// Forwards of 5 and 6 rows that took nearly the same time: the
		// fitted slope is 0.1 ms a row.
		s.cost.add(5+i%2, 10*time.Millisecond+time.Duration(i%2)*100*time.Microsecond)
	}
	s.decodeOnly.t.add(6 * time.Millisecond)
	s.decodeOnly.rows.add(1)
	if n := s.prefillBeside(1, 9*time.Millisecond); n < 20 {
		t.Fatalf("the model alone fits %d rows in 3 ms; the scenario needs its low slope", n)
	}
	s.besideRow.add(1500 * time.Microsecond)
	if n := s.prefillBeside(1, 9*time.Millisecond); n != 2 {
		t.Fatalf("%d prefill rows fit in 3 ms at a measured 1.5 ms a row, want 2", n)
	}
}

// A price of prefill rows beside decode rows pushed too high by one
// stalled forward does not keep prompts out for good: the sample counts
// at most 4x the price so far, and while prompts get no row at the
// measured price one decode iteration in besideProbeEvery takes
// --iteration-tokens rows, which measure the price again; a normal
// forward then brings it back down and prefill rides beside decode again.
func TestPlanBesidePriceRecovers(t *testing.T) {
	sc := newScript(t, Config{IterationTokens: 2, DecodeGroups: -1, DecodeQuiet: -1, MaxSessions: 12},
		func(i *backend.Info) { i.MaxBatch, i.MaxSeqs, i.CtxTokens = 64, 13, 4096 })
	ids := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	sc.prefilled(2, ids...)
	round := func(took func(rows int) time.Duration) string {
		for _, id := range ids {
			sc.submit(id, 0)
		}
		p := sc.plan()
		sc.run(took(sc.fp.rows))
		for _, id := range ids {
			sc.replies(id)
		}
		return p
	}
	price := func(rows int) time.Duration { return 8*time.Millisecond + time.Duration(rows)*time.Millisecond }
	for range 40 { // decode rounds: anchor the decode time and fit the cost line
		round(price)
	}
	sc.submit("p", 400)
	beside := func(p string) bool { return strings.Contains(p, "p:p") }
	if !beside(round(price)) {
		t.Fatal("no prefill beside the decode rows at 1 ms a row")
	}
	before := sc.s.besideRow.v
	// One stalled forward: 250 ms for its few prefill rows.
	round(func(rows int) time.Duration { return price(rows) + 250*time.Millisecond })
	if got := sc.s.besideRow.v; got > before+before*4/8 {
		t.Fatalf("one stalled forward moved the price from %v to %v", before, got)
	}
	// Even a price that lets no row in comes back: probes measure it.
	sc.s.besideRow.v = time.Second
	var got []bool
	for range 3 * besideProbeEvery {
		got = append(got, beside(round(price)))
	}
	if got[0] || !slices.Contains(got[:besideProbeEvery], true) {
		t.Fatalf("prefill beside decode by round at a 1 s price: %v, want a probe within %d rounds", got, besideProbeEvery)
	}
	if !got[len(got)-1] || sc.s.besideRow.v > 10*time.Millisecond {
		t.Fatalf("the price did not come back (%v; beside by round %v)", sc.s.besideRow.v, got)
	}
}

// The first decode iteration runs without prefill rows, whatever waits:
// its time anchors the decode budget. The next one takes prefill beside
// (here IterationTokens: the cost model has too few forwards to price rows).
func TestPlanFirstDecodeAnchors(t *testing.T) {
	sc := newScript(t, Config{IterationTokens: 8, DecodeGroups: -1, DecodeQuiet: -1}, nil)
	sc.prefilled(2, "a", "b")
	sc.submit("a", 0)
	sc.submit("b", 0)
	sc.submit("p", 100)
	sc.expect("anchor", sc.step(0), "a:d1 b:d1")
	if !sc.s.decodeOnly.t.ok {
		t.Fatal("the decode-only iteration was not taken as the anchor")
	}
	sc.replies("a")
	sc.replies("b")
	sc.submit("a", 0)
	sc.submit("b", 0)
	sc.expect("beside", sc.step(0), "a:d1 b:d1 p:p6")
}

// A prefill-only iteration that brings more sessions to their first token
// than are decoding is not preemptible: the first session of a burst, back
// with its decode step, does not stop the iteration carrying the rest. One
// that brings fewer is.
func TestPlanBurstNotPreempted(t *testing.T) {
	sc := newScript(t, Config{PrefillIterationTokens: 64, DecodeQuiet: -1}, nil)
	sc.prefilled(8, "a")
	for _, id := range []string{"b", "c", "d"} {
		sc.submit(id, 8)
	}
	sc.expect("burst", sc.plan(), "b:p8 c:p8 d:p8")
	if sc.fp.preemptible {
		t.Fatal("a burst of three prompts beside one decoding session is preemptible")
	}
	sc.run(0)
	sc.submit("e", 8)
	sc.expect("one more", sc.plan(), "e:p8")
	if !sc.fp.preemptible {
		t.Fatal("one prompt beside four decoding sessions is not preemptible")
	}
}

// A session that finished a prompt and has sent no decode step since is
// not waited for: a decode iteration held for it (DecodeGroups) would
// wait its whole window every step beside sessions that only prefill.
func TestPlanHoldIgnoresPromptOnlySessions(t *testing.T) {
	sc := newScript(t, Config{DecodeGroups: 1, DecodeQuiet: time.Second}, nil)
	sc.prefilled(2, "d")
	for i := range costMinRuns {
		sc.submit("d", 0)
		sc.expect(fmt.Sprint("decode ", i), sc.step(0), "d:d1")
		sc.replies("d")
	}
	sc.submit("p", 4)
	for strings.HasPrefix(sc.plan(), "wait ") {
		sc.now = sc.s.wake.Add(time.Millisecond) // d's step was due; it did not come
	}
	sc.expect("prompt", sc.step(0), "p:p4")
	sc.submit("d", 0)
	sc.expect("decode beside a prompt-only session", sc.plan(), "d:d1")
	sc.run(0)
	// Once p sends a decode step it counts as decoding: its step waits
	// for d's, and they run together.
	sc.submit("p", 0)
	if got := sc.plan(); !strings.HasPrefix(got, "wait ") {
		t.Fatalf("p's step did not wait for d's: %q", got)
	}
	sc.submit("d", 0)
	sc.expect("together", sc.plan(), "d:d1 p:d1") // in KV sequence order
}

// On a shard (DecodeGroups 2) a decode iteration takes one group's share
// of the decoding sessions' steps, the earliest arrivals first, and the
// rest wait for the next group: groups of 3 and 1 become 2 and 2 in one
// trip. A worker holding the whole model (DecodeGroups 1) takes them all,
// and so does a shard that counts no session as decoding (DecodeQuiet
// negative forgets them at once).
func TestPlanDecodeGroupShare(t *testing.T) {
	for _, c := range []struct {
		groups int
		quiet  time.Duration
	}{{2, time.Second}, {1, time.Second}, {2, -1}} {
		sc := newScript(t, Config{DecodeGroups: c.groups, DecodeQuiet: c.quiet}, nil)
		sc.prefilled(2, "a", "b", "c", "d")
		sc.submit("d", 0)
		sc.expect("d alone at first", sc.step(0), "d:d1")
		sc.replies("d")
		sc.now = sc.now.Add(time.Millisecond)
		sc.submit("c", 0)
		sc.submit("a", 0)
		sc.submit("b", 0)
		if c.groups == 1 || c.quiet < 0 {
			sc.expect(fmt.Sprintf("groups %d, quiet %v: every step in one forward", c.groups, c.quiet), sc.step(0), "a:d1 b:d1 c:d1")
			continue
		}
		sc.expect("a group's share", sc.step(0), "a:d1 c:d1")
		sc.expect("c and a answered", sc.replies("c")+"; "+sc.replies("a")+"; "+sc.replies("b"), "ack 2; ack 2; ")
		sc.submit("d", 0)
		sc.expect("b joins d", sc.step(0), "b:d1 d:d1")
	}
}

// The decode budget: once the cost model has seen enough forwards, an
// iteration with decode rows takes as many prefill tokens as the model
// predicts fit in 1.5x the decode rows' own measured time.
func TestPlanDecodeBudgetPacking(t *testing.T) {
	sc := newScript(t, Config{IterationTokens: 1, DecodeGroups: -1, DecodeQuiet: -1}, nil)
	sc.prefilled(2, "a", "b")
	for i := range costMinRuns {
		sc.submit("a", 0)
		sc.submit("b", 0)
		// No model yet, or the decode rows alone to measure them: no
		// prefill rows beside them (IterationTokens 1).
		sc.expect(fmt.Sprint("decode only ", i), sc.step(0), "a:d1 b:d1")
		sc.replies("a")
		sc.replies("b")
	}
	sc.submit("a", 0)
	sc.submit("b", 0)
	sc.submit("p", 100)
	// Budget 1.5 x (2 ms + 2 x 0.5 ms) = 4.5 ms; 2 ms + 0.5 ms x 5 rows
	// fits it: 2 decode rows and 3 prefill tokens.
	sc.expect("packed", sc.step(0), "a:d1 b:d1 p:p3")
	// It took 2 ms + 5 x 0.5 ms, the decode rows alone 3 ms: a prefill row
	// beside them cost 0.5 ms.
	if got := sc.s.besideRow.v; got != costRow {
		t.Fatalf("measured cost of a prefill row beside decode rows %v, want %v", got, costRow)
	}
	if sc.s.budgetRuns == 0 || sc.s.budgetHits != sc.s.budgetRuns {
		t.Fatalf("budget kept in %d of %d iterations", sc.s.budgetHits, sc.s.budgetRuns)
	}
	// A forward that overran its budget is counted as such.
	sc.submit("a", 0)
	sc.submit("b", 0)
	sc.step(10 * time.Millisecond)
	if sc.s.budgetHits != sc.s.budgetRuns-1 {
		t.Fatalf("an overrun counted as kept: %d of %d", sc.s.budgetHits, sc.s.budgetRuns)
	}
}

// The prefill beside decode rows is priced by the margin: the time the
// decode rows are measured to take alone, plus the model's cost per added
// row. On a CPU the fitted line's intercept sits far above what a small
// decode batch takes (its cost per row falls as the batch grows); pricing
// the decode rows by the line left no prefill beside a few decoding
// sessions, and their waiting prompts starved.
func TestPlanBudgetPricesTheMargin(t *testing.T) {
	sc := newScript(t, Config{IterationTokens: 1, DecodeGroups: -1, DecodeQuiet: -1, PrefillIterationTokens: 32},
		func(i *backend.Info) { i.CtxTokens = 1024 })
	sc.prefilled(2, "a", "b")
	// Large prefill batches: 16 rows in 20 ms, 32 in 28 ms (a line of
	// 12 ms + 0.5 ms a row).
	for i := range costMinRuns {
		sc.submit("big", 32)
		sc.expect(fmt.Sprint("32 rows ", i), sc.step(28*time.Millisecond), "big:p32")
		sc.submit("big", 16)
		sc.expect(fmt.Sprint("16 rows ", i), sc.step(20*time.Millisecond), "big:p16")
	}
	// Two decode rows take 3 ms alone: under the line's intercept.
	sc.submit("a", 0)
	sc.submit("b", 0)
	sc.expect("decode alone", sc.step(3*time.Millisecond), "a:d1 b:d1")
	sc.replies("a")
	sc.replies("b")
	base, perRow, _ := sc.s.cost.coef()
	if base <= 0.0045 {
		t.Fatalf("the line's intercept is %.1f ms: the scenario needs one past the budget (4.5 ms)", base*1e3)
	}
	// Budget 1.5 x 3 ms: 1.5 ms beside the decode rows, at the line's
	// slope per prefill row.
	want := int(0.0015 / perRow)
	if want < 1 {
		t.Fatalf("slope %.2f ms a row leaves no row in 1.5 ms", perRow*1e3)
	}
	sc.submit("a", 0)
	sc.submit("b", 0)
	sc.submit("p", 100)
	sc.expect("packed", sc.plan(), fmt.Sprintf("a:d1 b:d1 p:p%d", want))
}

// A prefill-only iteration does not start when a decode step is due
// before even one prefill token would finish: the scheduler waits for the
// step (past its due time by dueSlack at most), which then runs at once
// with prefill beside it.
func TestPlanWaitsForDueDecode(t *testing.T) {
	sc := newScript(t, Config{IterationTokens: 4, DecodeGroups: -1}, nil)
	sc.prefilled(2, "a")
	sc.decodeEveryMs("a")
	sc.submit("p", 50)
	sc.expect("prefill alone", sc.plan(), fmt.Sprint("wait ", dueSlack))
	if sc.s.dueWaits != 1 {
		t.Fatalf("due waits %d", sc.s.dueWaits)
	}
	sc.submit("a", 0)
	// Budget 1.5 x 2.5 ms: 1 decode row and 2 prefill rows fit, but an
	// iteration takes IterationTokens (4) at least.
	sc.expect("with the step", sc.plan(), "a:d1 p:p3")
	// Right after it, the next step is due within the prefill's first
	// token again: wait again, to about dueSlack past it.
	sc.run(0)
	sc.replies("a")
	if got := sc.plan(); !strings.HasPrefix(got, "wait ") || sc.s.wake.Sub(sc.now) > dueSlack+2*time.Millisecond {
		t.Fatalf("before the next step: %q", got)
	}
	// A session that stops decoding is not waited for: once its step is
	// overdue by more than its gap, prefill runs alone.
	sc.now = sc.now.Add(20 * time.Millisecond)
	sc.expect("a stopped", sc.plan(), "p:p4")
}

// When the prompts waiting outnumber the sessions decoding, the decode
// budget gives way: an iteration takes up to PrefillIterationTokens prompt
// tokens, beside the decode rows or alone, though a decode step is due.
// Otherwise a few sessions decoding in small fast batches held the many
// waiting for their first token to a prompt row or so per iteration.
func TestPlanPromptsOutnumberDecoders(t *testing.T) {
	prompts := []string{"b", "c", "d", "e", "f", "g"}
	decoding := func() *script {
		sc := newScript(t, Config{IterationTokens: 4, DecodeGroups: -1, PrefillIterationTokens: 64},
			func(i *backend.Info) { i.MaxSeqs = 8 })
		sc.prefilled(2, "a")
		sc.decodeEveryMs("a")
		return sc
	}
	all := "b:p8 c:p8 d:p8 e:p8 f:p8 g:p8"

	// Beside a decode step: the budget alone would fit 3 prompt rows.
	sc := decoding()
	for _, id := range prompts {
		sc.submit(id, 8)
	}
	sc.submit("a", 0)
	sc.expect("beside the step", sc.plan(), "a:d1 "+all)
	sc.run(0)

	// Alone, with a's step due within a millisecond: not waited for.
	sc = decoding()
	for _, id := range prompts {
		sc.submit(id, 8)
	}
	sc.expect("before the step", sc.plan(), all)

	// One prompt beside one decoding session is not a crowd: it waits for
	// the due step as before.
	sc = decoding()
	sc.submit("b", 8)
	if got := sc.plan(); !strings.HasPrefix(got, "wait ") {
		t.Fatalf("one prompt beside one decoding session: %q", got)
	}

	// Prompts that one iteration cannot all finish still count: three of
	// 40 tokens against a budget of 64 (one would finish in it).
	sc = decoding()
	for _, id := range prompts[:3] {
		sc.submit(id, 40)
	}
	sc.submit("a", 0)
	sc.expect("longer prompts", sc.plan(), "a:d1 b:p40 c:p23") // the batch holds 64 rows

	// A prompt streamed in chunks (position 0 not final, or a later
	// chunk) never counts: its chunks take the budget beside the step.
	sc = decoding()
	for _, id := range prompts[:3] {
		w := sc.make(id, 8)
		w.final = false
		sc.queue(w)
	}
	sc.submit("a", 0)
	if got := sc.plan(); got != "a:d1 b:p3" {
		t.Fatalf("chunks of streamed prompts took a whole prefill budget: %q", got)
	}

	// Nor does the last chunk of one (final, but not from position 0).
	sc = newScript(t, Config{IterationTokens: 4, DecodeGroups: -1, PrefillIterationTokens: 64},
		func(i *backend.Info) { i.MaxSeqs = 8 })
	sc.prefilled(2, "a")
	for _, id := range prompts[:3] {
		w := sc.make(id, 8)
		w.final = false
		sc.queue(w)
	}
	sc.expect("first chunks", sc.step(0), "b:p8 c:p8 d:p8")
	sc.decodeEveryMs("a")
	// A second on, the first chunks no longer count their sessions as
	// decoding: a alone does.
	sc.now = sc.now.Add(1100 * time.Millisecond)
	for _, id := range prompts[:3] {
		sc.replies(id)
		sc.submit(id, 8) // final, from position 8
	}
	sc.submit("a", 0)
	if got := sc.plan(); got != "a:d1 b:p3" {
		t.Fatalf("last chunks of streamed prompts took a whole prefill budget: %q", got)
	}
}

// A prefill-only iteration is preemptible; a preempted one is rewound
// (its rows trimmed from the KV, run again later), and the next
// prefill-only iteration runs to its end, so decode steps arriving every
// few milliseconds cannot starve prompts.
func TestPlanPreemption(t *testing.T) {
	sc := newScript(t, Config{PrefillIterationTokens: 8, DecodeQuiet: -1}, nil)
	sc.submit("p", 20)
	sc.expect("first", sc.plan(), "p:p8")
	if !sc.fp.preemptible {
		t.Fatal("a prefill-only iteration is not preemptible")
	}
	sc.s.advance(forwardOutcome{took: time.Millisecond, err: backend.ErrPreempted})
	if len(sc.s.fx.trims) != 1 || sc.s.fx.trims[0] != (trimOp{seq: sc.fp.items[0].w.seq, pos: 0}) {
		t.Fatalf("rewind trims %v", sc.s.fx.trims)
	}
	sc.d.apply()
	sc.expect("again", sc.plan(), "p:p8")
	if sc.fp.preemptible {
		t.Fatal("the iteration after a preempted one is preemptible")
	}
	sc.run(time.Millisecond)
	sc.expect("then", sc.plan(), "p:p8")
	if !sc.fp.preemptible {
		t.Fatal("preemption did not come back after an iteration ran to its end")
	}
}

// Decode rows go in in their sessions' KV sequence order, whatever order
// their steps arrived in: each session's cells then keep a steady stride
// in the shared KV buffer.
func TestPlanDecodeRowsInSequenceOrder(t *testing.T) {
	sc := newScript(t, Config{DecodeGroups: -1, DecodeQuiet: -1}, nil)
	ids := []string{"a", "b", "c", "d"}
	sc.prefilled(1, ids...)
	for _, order := range [][]string{{"d", "b", "a", "c"}, {"c", "a", "d", "b"}} {
		for _, id := range order {
			sc.submit(id, 0)
		}
		got := sc.plan()
		if len(sc.fp.items) != len(ids) {
			t.Fatalf("arrival %v: planned %q, want all %d decode rows", order, got, len(ids))
		}
		if !slices.IsSortedFunc(sc.fp.items, func(a, b planned) int { return a.w.seq - b.w.seq }) {
			t.Fatalf("arrival %v: rows %q not in sequence order", order, got)
		}
		sc.run(0)
		for _, id := range ids {
			sc.replies(id)
		}
	}
}

// A full batch: decode steps beyond MaxBatch wait for the next iteration,
// and the ones left out are taken first then (sessions re-queue at the
// end), so no session is left out twice in a row. The rows taken go to
// the backend in KV sequence order.
func TestPlanBatchFull(t *testing.T) {
	sc := newScript(t, Config{DecodeGroups: -1, DecodeQuiet: -1, MaxSessions: 6}, func(i *backend.Info) { i.MaxBatch, i.MaxSeqs = 4, 8 })
	ids := []string{"a", "b", "c", "d", "e", "f"}
	sc.prefilled(1, ids...)
	for _, id := range ids {
		sc.submit(id, 0)
	}
	sc.expect("first", sc.step(0), "a:d1 b:d1 c:d1 d:d1")
	if calls := sc.fb.Calls; len(calls[len(calls)-1]) != 4 {
		t.Fatalf("the four decode steps did not go to the backend in one call: %v", calls)
	}
	if h := sc.e.Stats().Occupancy; h != 4 {
		t.Fatalf("published batch occupancy %d, want 4", h)
	}
	// The four that ran send their next steps at once: they queue behind
	// the two left out.
	for _, id := range ids[:4] {
		sc.expect(id, sc.replies(id), "ack 2")
		sc.submit(id, 0)
	}
	sc.expect("second", sc.step(0), "a:d1 b:d1 e:d1 f:d1")
	sc.expect("third", sc.step(0), "c:d1 d:d1")
	for _, id := range ids {
		want := "ack 3"
		if id == "e" || id == "f" {
			want = "ack 2"
		}
		sc.expect(id, sc.replies(id), want)
	}
}

// The exact mode: decode steps and prefill chunks take turns while
// both wait; a decode turn carries every ready session's step (all of a,
// b and c in one forward, not one session's row), a prefill turn one
// session's chunk, whole (6 tokens although iterations take 2).
func TestPlanExactTurns(t *testing.T) {
	sc := newScript(t, Config{Exact: true, PrefillIterationTokens: 2, IterationTokens: 2, DecodeGroups: -1}, func(i *backend.Info) { i.MaxSeqs = 8 })
	sc.prefilled(2, "a", "b", "c")
	sc.submit("a", 0)
	sc.submit("b", 0)
	sc.submit("c", 0)
	sc.submit("p", 6)
	sc.submit("q", 3)
	var got []string
	for sc.s.pending > 0 {
		got = append(got, sc.step(0))
	}
	sc.expect("turns", strings.Join(got, " | "), "q:p3 | a:d1 b:d1 c:d1 | p:p6")

	// Prompt chunks of one length share a forward within the budget (8
	// rows: two of 3), each whole; a chunk of another length waits for a
	// turn of its own.
	sc = newScript(t, Config{Exact: true, PrefillIterationTokens: 8, IterationTokens: 2, DecodeGroups: -1}, func(i *backend.Info) { i.MaxSeqs = 8 })
	sc.submit("p", 3)
	sc.submit("q", 5)
	sc.submit("r", 3)
	sc.submit("u", 3)
	got = got[:0]
	for sc.s.pending > 0 {
		got = append(got, sc.step(0))
	}
	sc.expect("chunks", strings.Join(got, " | "), "p:p3 r:p3 | u:p3 | q:p5")
}

// Eviction while work is queued: a session whose next step waits in the
// queue is pinned, so a newcomer evicts the idle one instead, which then
// declares a cache miss.
func TestPlanEvictionSparesQueuedWork(t *testing.T) {
	sc := newScript(t, Config{MaxSessions: 2, DecodeGroups: -1, DecodeQuiet: -1}, nil)
	sc.prefilled(2, "a", "b")
	// a is the least recently used, but its next step is queued: the
	// newcomer c evicts b.
	sc.submit("a", 0)
	sc.submit("c", 2)
	for sc.s.pending > 0 {
		sc.step(time.Millisecond)
	}
	sc.expect("a", sc.replies("a"), "ack 2")
	sc.expect("c", sc.replies("c"), "ack 1")
	sc.submit("b", 0)
	sc.step(time.Millisecond)
	sc.expect("b", sc.replies("b"), "CACHE_MISS 2")
}

// Cancel refuses queued work with CANCELLED, and an already-applied step
// sent again is answered as a duplicate from the results cache.
func TestPlanCancelAndDuplicate(t *testing.T) {
	sc := newScript(t, Config{DecodeGroups: -1}, nil)
	sc.prefilled(2, "a")
	sc.submit("a", 0)
	if n := sc.s.cancel("a", 1, ""); n != 1 {
		t.Fatalf("cancelled %d", n)
	}
	sc.d.apply()
	sc.expect("cancelled", sc.replies("a"), "CANCELLED 2")
	// Step 1 again (a retry after a lost connection).
	p := sc.next["a"]
	p.step, p.pos = 0, 0
	sc.submit("a", 2)
	sc.step(time.Millisecond)
	sc.expect("retry", sc.replies("a"), "dup 1")
}

// A decode step costs the scheduler no allocation: the items arrive built
// (the stream makes them), plan, advance and the effects reuse their
// slices and queues, the results cache its nodes, and the result and its
// output buffer come from pools. Measured over 16 sessions decoding
// together, the forward itself left out (the fake backend records its
// calls).
func TestPlanDecodeStepAllocs(t *testing.T) {
	// The first rounds fill the results cache (each session keeps its last
	// MaxInflightChunks results) and the pools; then it holds steady.
	const sessions, warm, rounds = 16, 20, 40
	sc := newScript(t, Config{DecodeGroups: -1, DecodeQuiet: -1, MaxSessions: sessions}, func(i *backend.Info) { i.MaxBatch, i.MaxSeqs, i.CtxTokens = 64, sessions+1, 4096 })
	ids := make([]string, sessions)
	for i := range ids {
		ids[i] = fmt.Sprint("s", i)
	}
	sc.prefilled(1, ids...)
	steps := make([][]*work, warm+rounds+1)
	for r := range steps {
		for _, id := range ids {
			steps[r] = append(steps[r], sc.make(id, 0))
		}
	}
	out := backend.Output{Hidden: make([]float32, sessions*sc.e.info.Hidden)}
	r := 0
	round := func() {
		for _, w := range steps[r] {
			sc.queue(w)
		}
		r++
		fp, ok := sc.s.plan(sc.now)
		if !ok || fp.rows != sessions {
			t.Fatalf("planned %d rows, want %d: %v", fp.rows, sessions, sc.s.fx.deliveries[0].r.status)
		}
		sc.now = sc.now.Add(costBase)
		sc.s.advance(forwardOutcome{took: costBase, out: &out})
		sc.d.apply()
		for _, id := range ids {
			(<-sc.streams[id].replies).release()
		}
	}
	for range warm {
		round()
	}
	perStep := testing.AllocsPerRun(rounds, round) / sessions
	t.Logf("%.2f allocations per decode step", perStep)
	// The bound is 0 in a plain build (the code before this test made
	// 5.62). The bufpool ownership checks (-tags invariants) never reuse a
	// Buffer struct: 1 a step. Under -race, sync.Pool drops a random share
	// of what it is given and the detector allocates too (1.2-2.0 a step
	// measured): there the bound only catches an allocation that every
	// step makes. (TestSessionDecodeStepAllocs, one session, holds the
	// step that made fewest to the bound in every build.)
	limit := 0.0
	switch {
	case race.Enabled && bufpool.Invariants:
		limit = 3
	case race.Enabled:
		limit = 2
	case bufpool.Invariants:
		limit = 1
	}
	if perStep > limit {
		t.Fatalf("%.2f allocations per decode step, want at most %g", perStep, limit)
	}
}
