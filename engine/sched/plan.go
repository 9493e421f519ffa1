package sched

import (
	"cmp"
	"slices"
	"time"
)

// Forward is a planned forward: Items are its rows, by item.
type Forward struct {
	Items   []Planned // valid until the next plan
	Rows    int
	Decodes int           // sessions whose decode step the iteration took in
	Limit   time.Duration // the iteration's time budget (0: none)
	// Preemptible: a prefill-only iteration a decode step may stop.
	Preemptible bool
	// Probe: its prefill rows beside the decode rows are there to price
	// them again (besideBudget); the price measured replaces the old one.
	Probe bool
}

// Planned is one item's share of an iteration: rows [From, From+N).
type Planned struct {
	Item    *Item
	From, N int
}

// decodeAnchorEvery: one decode iteration in this many runs without
// prefill rows, so the decode budget's anchor stays measured.
const decodeAnchorEvery = 32

// decodeBudget is the time an iteration with rows decode rows may take (0
// while it cannot be known yet, or with no time budget): the set budget,
// or 1.5x the decode rows' own time (decodeTime).
func (s *Scheduler) decodeBudget(rows int) time.Duration {
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
func (s *Scheduler) decodeTime(rows int) (time.Duration, bool) {
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
// starved every waiting prompt.
func (s *Scheduler) prefillBeside(rows int, limit time.Duration) int {
	t, ok := s.decodeTime(rows)
	if !ok {
		return 0
	}
	return s.cost.fitAfterAtLeast(t, limit, s.besideRow.v)
}

// besideProbeEvery: while prompts wait and the measured price of a prefill
// row beside decode rows lets none in, one decode iteration in this many
// takes --iteration-tokens prefill rows anyway, to price them again.
const besideProbeEvery = 8

// besideBudget is prefillBeside, except that while prompts wait (waiting)
// and it is 0, every besideProbeEvery-th such iteration takes
// --iteration-tokens rows (at least one), whose measured price replaces
// the old one (Forward.probe). The price is measured only on
// iterations with prefill rows beside decode rows: without the probe, a
// price once too high (one stalled forward can do it) let no prefill row
// in again, nothing measured it again, and a busy worker's prompts waited
// for decoding sessions to end, whole generations.
func (s *Scheduler) besideBudget(rows int, limit time.Duration, waiting bool) int {
	n := s.prefillBeside(rows, limit)
	if n > 0 || !waiting || !s.besideRow.ok {
		s.besideStarved = 0
		return n
	}
	s.besideStarved++
	if s.besideStarved < besideProbeEvery {
		return 0
	}
	s.besideStarved = 0
	s.besideProbes++
	s.probing = true
	return max(s.cfg.IterationTokens, 1)
}

// Plan decides the next iteration at now: decode steps first, then
// prefill tokens up to the iteration's budget (orderPrefills). It returns
// the forward to run, if any; refusals and trims it decides are in s.fx,
// and a time to plan again at (a hold) in s.wake.
func (s *Scheduler) Plan(now time.Time) (Forward, bool) {
	s.at = now
	s.fwd, s.probing = Forward{}, false
	decodes, prefills := s.admitHeads()
	decodes, wait := s.gatherDecodes(now, decodes)
	if wait {
		return Forward{}, false
	}
	budget, limit, wait := s.iterationBudget(now, decodes, prefills)
	if wait {
		return Forward{}, false
	}
	if s.cfg.Exact {
		decodes, prefills, budget = s.exactTurns(decodes, prefills, budget)
	}
	rows := s.fill(now, decodes, prefills, budget)
	if rows == 0 {
		return Forward{}, false
	}
	s.fwd = Forward{Items: s.planned, Rows: rows, Decodes: len(decodes), Limit: limit,
		Preemptible: s.preemptible(now, len(decodes)), Probe: s.probing}
	return s.fwd, true
}

// admitHeads admits each session's first unit of work and sorts the
// admitted into decode steps and prefill chunks; refused heads are answered
// and dropped, and the next of their session is tried.
func (s *Scheduler) admitHeads() (decodes, prefills []*sessQueue) {
	decodes, prefills = s.decodes[:0], s.prefills[:0]
	for i := 0; i < len(s.ring); i++ {
		q := s.ring[i]
		for len(q.items) > 0 {
			switch r := s.admit(q.items[0]); r {
			case admitRun:
				if q.items[0].Mode == Decode {
					decodes = append(decodes, q)
				} else {
					prefills = append(prefills, q)
				}
			case admitDrop, admitDone:
				if r == admitDrop {
					s.pop(q) // admitDone: completed, popped already
				}
				if len(q.items) == 0 {
					i-- // pop removed q from the ring
				}
				continue
			}
			break
		}
	}
	s.decodes, s.prefills = decodes, prefills // keep what they grew to
	return decodes, prefills
}

// gatherDecodes applies the gathering rule (--decode-groups): wait while
// too few of the decoding sessions are ready, and take no more than one
// group's share, the earliest arrivals first, so uneven groups (18 and 14
// of 32) even out in one trip instead of the smaller one holding its
// window every time round. The share applies only while the gatherer
// counts some session as decoding.
func (s *Scheduler) gatherDecodes(now time.Time, decodes []*sessQueue) ([]*sessQueue, bool) {
	if len(decodes) == 0 {
		return decodes, false
	}
	cfg := &s.cfg
	decoding := s.gather.decoding(now, cfg.DecodeQuiet, cfg.DecodeGroups > 1)
	if wait := s.gather.hold(now, len(decodes), decoding, cfg.DecodeGroups, cfg.GatherWindow, s.cost.predict); wait > 0 {
		s.wake = now.Add(wait)
		return nil, true
	}
	if g := cfg.DecodeGroups; g > 1 && decoding > 0 {
		if share := (max(decoding, len(decodes)) + g - 1) / g; len(decodes) > share {
			decodes = decodes[:share]
		}
	}
	return decodes, false
}

// iterationBudget is the iteration's token budget, and its time limit when
// it carries decode steps: the decode rows plus the prefill tokens the cost
// model predicts fit the decode budget (at least --iteration-tokens), now
// and then the decode rows alone (to measure them), and a whole prefill
// budget while a crowd of short prompts waits (crowd).
// wait: hold prefill back for a decode step that is due.
func (s *Scheduler) iterationBudget(now time.Time, decodes, prefills []*sessQueue) (budget int, limit time.Duration, wait bool) {
	cfg := &s.cfg
	budget = cfg.PrefillIterationTokens
	switch {
	case len(decodes) > 0:
		rows := 0
		for _, q := range decodes {
			rows += q.items[0].Tokens - q.items[0].Done
		}
		s.lastDecode, s.lastDecodeRows = now, rows
		limit = s.decodeBudget(rows)
		budget = rows + max(cfg.IterationTokens-rows, s.besideBudget(rows, limit, len(prefills) > 0))
		if (s.sinceDecodeOnly >= decodeAnchorEvery || !s.decodeOnly.t.ok) && cfg.DecodeBudget == 0 {
			budget = rows
		}
		if s.crowd(prefills, len(decodes), now) {
			budget = rows + cfg.PrefillIterationTokens
		} else if n := s.overdueTokens(prefills, now); rows+n > budget {
			budget = rows + n
		}
	case now.Sub(s.lastDecode) < cfg.DecodeQuiet:
		if budget, wait = s.budgetBeforeStep(now, prefills); wait {
			return 0, 0, true
		}
	}
	return min(budget, s.info.MaxBatch), limit, false
}

// budgetBeforeStep is a prefill iteration's budget while a decode step is
// likely on its way: no more than prefill would get beside the step, and no
// more than ends before the step is due. When not even one token would, it
// waits for the step, which then runs at once with prefill beside it.
func (s *Scheduler) budgetBeforeStep(now time.Time, prefills []*sessQueue) (int, bool) {
	cfg := &s.cfg
	if s.crowd(prefills, 0, now) {
		return cfg.PrefillIterationTokens, false
	}
	budget := max(cfg.IterationTokens, s.prefillBeside(s.lastDecodeRows, s.decodeBudget(s.lastDecodeRows)))
	if n := s.overdueTokens(prefills, now); n > 0 {
		return max(budget, n), false // not held back for a due step either
	}
	due, ok := s.gather.due(now)
	if !ok || cfg.DecodeBudget < 0 {
		return budget, false
	}
	if _, ready := s.cost.predict(1); !ready {
		return budget, false
	}
	n := s.cost.fit(0, due.Sub(now))
	if n == 0 {
		if due.Before(now) {
			due = now
		}
		s.wake = due.Add(dueSlack)
		s.dueWaits++
		return 0, true
	}
	return min(budget, n), false
}

// exactTurns is the exact mode's plan: decode steps and prefill
// chunks take turns while both wait, so neither starves the other. A
// decode turn carries every decode step that is ready (one row each, the
// backend computes them together); a prefill turn one session's chunk,
// whole, round robin, and other sessions' chunks of as many rows within
// the iteration's budget. The backend keeps each session's KV in a stream of
// its own and every operation of the forward is batch-invariant, so a
// row's bits do not depend on the rows beside it.
func (s *Scheduler) exactTurns(decodes, prefills []*sessQueue, budget int) ([]*sessQueue, []*sessQueue, int) {
	if len(prefills) > 0 && len(decodes) > 0 {
		s.prefillTurn = !s.prefillTurn
		if s.prefillTurn {
			decodes = nil
		}
	}
	for _, q := range decodes {
		if w := q.items[0]; w.Tokens-w.Done > 1 {
			return []*sessQueue{q}, nil, w.Tokens - w.Done // rows of several sessions go one each
		}
	}
	if len(decodes) > 0 {
		return decodes, nil, s.info.MaxBatch
	}
	if len(prefills) > 0 {
		// The next prompt's chunk, whole, and with it other prompts'
		// chunks of as many rows while the budget holds them: the backend
		// computes chunks of one length together, each on its own stream.
		at := s.rr % len(prefills)
		w := prefills[at].items[0]
		n := min(w.Tokens-w.Done, s.info.MaxBatch)
		limit := min(max(budget, n), s.info.MaxBatch)
		s.together = append(s.together[:0], prefills[at])
		for i := 1; i < len(prefills) && (len(s.together)+1)*n <= limit; i++ {
			q := prefills[(at+i)%len(prefills)]
			if w := q.items[0]; w.Tokens-w.Done == n {
				s.together = append(s.together, q)
			}
		}
		prefills, budget = s.together, len(s.together)*n
	}
	s.rr++
	return nil, prefills, budget
}

// fill plans the iteration's rows into s.planned: every decode step that
// fits, then prefill chunks in orderPrefills' order up to the budget. It
// returns the rows planned.
func (s *Scheduler) fill(now time.Time, decodes, prefills []*sessQueue, budget int) int {
	maxBatch := s.info.MaxBatch
	s.planned = s.planned[:0]
	rows := 0
	for _, q := range decodes {
		w := q.items[0]
		n := w.Tokens - w.Done
		if rows+n > maxBatch || (rows > 0 && rows+n > max(budget, len(decodes))) {
			continue
		}
		s.planned = append(s.planned, Planned{Item: w, From: w.Done, N: n})
		rows += n
	}
	// Decode rows go in in the order of their sessions' KV sequences, not
	// of their steps' arrival (which changes from step to step): a
	// session's cells then lie at a steady stride in the shared buffer,
	// where attention, reading each row's cells in cell order, runs faster
	// than over cells scattered by arrival order.
	slices.SortFunc(s.planned, func(a, b Planned) int { return a.Item.Seq - b.Item.Seq })
	if len(prefills) > 0 && rows < budget {
		left := budget - rows
		orderPrefills(prefills, now)
		for _, q := range prefills {
			w := q.items[0]
			n := min(w.Tokens-w.Done, left)
			if n <= 0 {
				break
			}
			s.planned = append(s.planned, Planned{Item: w, From: w.Done, N: n})
			left -= n
			rows += n
		}
	}
	for _, p := range s.planned {
		if p.Item.Started.IsZero() {
			p.Item.Started = now
		}
	}
	return rows
}

// preemptible says whether a decode step that arrives during this
// iteration may stop it instead of waiting for it: only a prefill-only
// iteration, not twice in a row (or decode steps arriving every few
// milliseconds would preempt every prefill iteration and prompts would
// never finish), and not when it brings more sessions to their first token
// than there are sessions decoding (stopping it would hold back more
// sessions than it serves).
func (s *Scheduler) preemptible(now time.Time, decodes int) bool {
	if decodes > 0 || s.preempted {
		return false
	}
	return s.finishing() <= s.gather.active(now, time.Second)
}

// crowd reports whether a crowd of sessions waits for a short prompt (or
// a chunk of one, shortPrompt): at least two of them, and more than two
// thirds as many as there are sessions decoding (those with a step in
// this iteration, decodes, or that completed one within the last second).
// Then an iteration takes PrefillIterationTokens of prompt tokens whatever
// the decode budget, and the next ones too while a crowd is left.
//
// The two thirds weigh one harm against another. Taken at once, the
// crowd's prompts (time T) make each decoding session's next step T
// longer. Spread beside decode steps within the decode budget (prefill
// gets a third of each iteration), they take 3T, and a waiting prompt,
// shortest first, gets its first token about 1.5T later than at once. So
// the crowd goes first when 1.5 x waiting > decoding. (The decoders lose
// about T either way.) Without the rule, a few sessions decoding in
// small, fast batches kept the prompt rows beside them near zero and
// batches stayed small. Were a crowd to outnumber the decoders, a burst of
// 32 8-token prompts arriving over the first forwards would leave 15
// waiting beside 17 decoding after one budget, a few rows a step until
// overdue: the last first token at 1.44-1.63 s against 0.72-0.76 s (Gemma
// 3, one worker, BenchmarkDecodeCeiling). One budget an iteration, not
// every waiting prompt's tokens: those made the decoders' step as long as
// 512 rows, and ITL p99 at 32 requests of 32-token prompts 1.04-1.15 s
// against 0.76-0.82 s (3 alternating rounds). Every such prompt counts,
// not only those one iteration would finish. One prompt is not a crowd:
// beside one decoding session it waits for its step and goes in beside it
// within the budget. A long prompt streamed in chunks never counts: its
// chunks take the budget beside the decoding sessions, which the budget is
// there to protect. The chunks of a short one do (shortPrompt): a head that
// pipelines prompts through the hops sends them so.
func (s *Scheduler) crowd(prefills []*sessQueue, decodes int, now time.Time) bool {
	if s.cfg.Exact || len(prefills) < 2 || 3*len(prefills) <= 2*decodes {
		return false
	}
	decoding := max(decodes, s.gather.active(now, time.Second))
	first := 0
	for _, q := range prefills {
		if s.shortPrompt(q.items[0]) {
			first++
		}
	}
	if first < 2 || 3*first <= 2*decoding {
		return false
	}
	s.crowds++
	return true
}

// shortPrompt reports whether w is a short prompt, or a chunk of one: the
// prompt ends by position PrefillIterationTokens, not counting w's rows
// already run (so a whole prompt from position 0 with that many tokens
// left is one). A head that pipelines a short prompt through the hops
// sends it in chunks, each saying how many are left (Item.PromptEnd).
func (s *Scheduler) shortPrompt(w *Item) bool {
	if w.Mode != Prefill {
		return false
	}
	end := w.PromptEnd
	if w.Final {
		end = w.First + w.Tokens
	}
	return end > 0 && end-w.Done <= s.cfg.PrefillIterationTokens
}

// overdueTokens is the tokens left of the short prompts (shortPrompt)
// that have waited longer than prefillPatience, up to
// PrefillIterationTokens: the iteration takes at least that many prompt
// rows, whatever the decode budget (orderPrefills puts those prompts
// first). Without it, prompts that arrived while most sessions decoded
// got the few rows the budget priced beside the decode rows, a wave of
// them waited for one another, and TTFT p99 ran to 3-4x llama-server's
// (Gemma 3, 32 requests). Only the overdue prompts' rows, not a whole
// prefill budget: the decode rows beside them pay for every row.
func (s *Scheduler) overdueTokens(prefills []*sessQueue, now time.Time) int {
	if s.cfg.Exact {
		return 0
	}
	n := 0
	for _, q := range prefills {
		if w := q.items[0]; s.shortPrompt(w) && now.Sub(w.Queued) > prefillPatience {
			n += w.Tokens - w.Done
		}
	}
	return min(n, s.cfg.PrefillIterationTokens)
}

// finishing counts the planned items that complete a prompt: after them
// their sessions decode.
func (s *Scheduler) finishing() int {
	n := 0
	for _, p := range s.planned {
		if w := p.Item; w.Mode == Prefill && w.Final && p.From+p.N == w.Tokens {
			n++
		}
	}
	return n
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
// prompt token before it.
func orderPrefills(prefills []*sessQueue, now time.Time) {
	slices.SortStableFunc(prefills, func(a, b *sessQueue) int {
		wa, wb := a.items[0], b.items[0]
		oldA, oldB := now.Sub(wa.Queued) > prefillPatience, now.Sub(wb.Queued) > prefillPatience
		switch {
		case oldA != oldB:
			if oldA {
				return -1
			}
			return 1
		case !oldA:
			if c := cmp.Compare(wa.Tokens-wa.Done, wb.Tokens-wb.Done); c != 0 {
				return c
			}
		}
		return wa.Queued.Compare(wb.Queued)
	})
}
