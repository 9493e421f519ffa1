package sched

import "time"

// Stats are the scheduler's figures, what Health and the metrics report.
// The driver makes them after every iteration (Scheduler.Stats, with its
// own two) and publishes them in one place; any goroutine reads a copy
// (engine.Engine.Stats).
type Stats struct {
	Sessions  int     // route sessions holding KV state
	Occupancy int     // rows in the last forward call
	Pressure  float64 // fraction of the KV token budget held or reserved
	// Sessions evicted (budget or TTL), admitted at their first prefill,
	// refused there, preempted for an admitted session's step, and
	// prefilled again after a loss.
	Evictions, Admitted, Refused, SessionsPreempted, Reprefilled int64
	ResultsBytes                                                 int64 // held by the results cache
	// The prefix cache: chunks that took rows from it, positions it
	// answered, bytes held, loads with no room, entries cut short.
	PrefixHits, PrefixTokens, PrefixBytes, PrefixMisfits, PrefixUnordered int64
	CostBase, CostPerRow                                                  float64 // the cost model, seconds
	// Iterations under a decode budget and those that kept it, prefill
	// iterations held back for a due decode step, decode iterations that
	// priced prefill rows again, prefill iterations preempted.
	BudgetRuns, BudgetHits, DueWaits, BesideProbes, Preemptions int64
	Crowds                                                      int64         // iterations whose prompt budget a crowd of short prompts set
	BesideRow                                                   time.Duration // the measured price of a prefill row beside decode rows
	Holds, HoldsExpired                                         int64         // decode iterations that waited for their group; of them, expired
	Held                                                        time.Duration // time held
	Busy                                                        time.Duration // time in forward calls
	// Forwards that first waited for the last one's results to be sent
	// (engine's sendGate); of them, those that gave up at the bound; the
	// time waited.
	SendWaits, SendWaitsExpired int64
	SendWaited                  time.Duration
	// CoreGBps is the forward thread's core speed, probed at most every
	// coreEvery just before a forward (hoststat.CopySpeed): on a shared
	// host a forward's time follows it, so a slow hop with a slow core
	// is the host's.
	CoreGBps float64
}

// Stats writes the scheduler's figures into st (all but the driver's
// Occupancy, Busy, CoreGBps and send waits).
func (s *Scheduler) Stats(st *Stats) {
	st.Sessions = s.store.Len()
	st.Pressure = s.store.Pressure()
	st.Evictions, st.Admitted, st.Refused = int64(s.store.Evictions), int64(s.store.Admitted), int64(s.store.Refused)
	st.SessionsPreempted, st.Reprefilled = int64(s.store.Preemptions), int64(s.store.Reprefills)
	st.ResultsBytes = s.results.Cost()
	if p := s.prefix; p != nil {
		st.PrefixHits, st.PrefixTokens, st.PrefixBytes = p.hits, p.tokens, p.entries.Cost()
		st.PrefixMisfits, st.PrefixUnordered = p.misfits, p.unordered
	}
	if base, perRow, ok := s.cost.coef(); ok {
		st.CostBase, st.CostPerRow = base, perRow
	}
	st.BudgetRuns, st.BudgetHits, st.DueWaits = s.budgetRuns, s.budgetHits, s.dueWaits
	st.BesideProbes, st.Preemptions, st.Crowds = s.besideProbes, s.preemptions, s.crowds
	st.BesideRow = time.Duration(s.besideRow.v)
	st.Holds, st.HoldsExpired, st.Held = s.gather.holds, s.gather.expired, s.gather.held
}
