package sched

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// The scheduler's scenarios that need more than the scripts in testdata
// can say: a cost model set by hand, a figure of the state read, a loop.

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

// Prefill rows beside decode rows are priced at no less than they were
// measured to cost there. A cost model fitted over forwards of nearly one
// size can come out with a slope far too low, and alone it would let a
// whole chunk in beside a decode step.
func TestPlanBesideRowsPricedAsMeasured(t *testing.T) {
	var s Scheduler
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
		func(i *Info) { i.MaxBatch, i.MaxSeqs, i.CtxTokens = 64, 13, 4096 })
	ids := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	sc.prefilled(2, ids...)
	round := func(took func(rows int) time.Duration) string {
		for _, id := range ids {
			sc.submit(id, 0)
		}
		p := sc.plan()
		sc.run(took(sc.fp.Rows))
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
		func(i *Info) { i.CtxTokens = 1024 })
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
