// Package engine is the ShardRuntime service: it turns Session streams into
// backend forward passes and back.
//
// Goroutines and ownership:
//
//	per stream:  receive goroutine (the gRPC handler)  -> decode, validate, run the
//	                                                      receive stages, submit work
//	             send goroutine                        -> frame out, the only Send caller
//	one:         scheduler goroutine (driver.run)      -> owns the backend, the session
//	                                                      store and the results cache
//
// Stages are joined by bounded queues: the submit queue (bounded by the
// queue depth; a full queue is RESOURCE_EXHAUSTED, never a block) and each
// stream's reply queue (sized so the flow-control window can never fill it).
// The scheduler never blocks on a peer.
//
// The scheduler runs iterations: each takes every waiting decode step
// first (one per session: continuous batching across sessions), then fills
// what is left of the iteration's token budget with prefill tokens. A long
// prefill never delays a decode step by more than one bounded iteration.
// Its rules, each with the serve flag that tunes it, the metric that shows
// it (Prometheus names: dots become underscores) and the test that pins it
// (sched/testdata/...: a scenario of engine/sched's TestScenarios):
//
//	rule                                        flag                       metric                               test
//	decode steps first, one forward for all     --iteration-tokens         shardd.batch.rows                    sched/testdata/decode_first_prefill_beside
//	prefill beside decode within the decode     --decode-budget            shardd.decode_budget.iterations,     TestPlanDecodeBudgetPacking,
//	  budget, priced by the measured cost                                  shardd.decode_budget.kept,           TestPlanBudgetPricesTheMargin,
//	  model (sched/cost.go)                                                shardd.cost.base, .per_row           TestPlanBesideRowsPricedAsMeasured
//	prompts get no row beside at the measured   --iteration-tokens         shardd.prefill.beside_probes,        TestPlanBesidePriceRecovers
//	  price: every 8th decode iteration takes                              shardd.cost.beside_row
//	  some anyway, to measure it again; one
//	  sample moves it at most 4x
//	decode rows alone every 32nd iteration,     -                          shardd.cost.per_row                  sched/testdata/first_decode_anchors
//	  to keep their own time measured
//	prefill: fewest tokens left first, oldest   -                          -                                    sched/testdata/prefill_shortest_first,
//	  first once a chunk waited 1 s                                                                             TestPlanPrefillPatience
//	prefill-only iterations take this many      --prefill-iteration-tokens shardd.batch.rows                    sched/testdata/prefill_shortest_first
//	a crowd of short prompts, or their chunks   --prefill-iteration-tokens shardd.prefill.crowds               sched/testdata/prompts_outnumber_decoders
//	  (2 or more, over 2/3 of the decoding
//	  sessions): a whole prefill budget beside
//	  the decode rows
//	short whole prompts waiting over 1 s: their --prefill-iteration-tokens -                                    sched/testdata/prompt_overdue
//	  rows beside the decode rows, whatever the
//	  decode budget
//	no prefill that would delay a due decode    --decode-quiet             shardd.decode_due.waits              TestPlanWaitsForDueDecode
//	  step; wait for the step instead
//	gather: wait until 1/N of the decoding      --decode-groups,           shardd.gather.holds, .held,          TestGatherHolds,
//	  sessions are ready, take one group's        --gather-window            shardd.gather.expired                sched/testdata/decode_group_share,
//	  share; prompt-only sessions not counted                                                                   sched/testdata/hold_ignores_prompt_only_sessions
//	the last forward's results are sent before  -                          shardd.frameout.waits, .waited,      TestAwaitSendsUntilReleased,
//	  the next forward takes the CPU (up to                                shardd.frameout.waits_expired        TestAwaitSendsBounded,
//	  2 ms; none while a peer is slow to read;                                                                  TestSendGateDroppedReplies,
//	  gate.go)                                                                                                  TestSendGateReleasedOnEveryPath
//	decode rows in KV sequence order            -                          -                                    sched/testdata/decode_rows_in_sequence_order
//	a decode step stops a prefill-only          -                          shardd.preemptions                   sched/testdata/preemption,
//	  iteration; not twice in a row, nor one                                                                    sched/testdata/burst_not_preempted,
//	  that finishes more prompts than decode                                                                    TestDecodePreemptsPrefill
//	no forward over the batch size              --max-batch                shardd.batch.occupancy               TestDriverBatchFull
//	exact mode: every ready decode step in      --exact (--deterministic)  shardd.streams.placeholder_rows,     sched/testdata/exact_turns
//	  one forward, prompt chunks of one length                             shardd.streams.copies
//	  in another, each whole, decode and prefill
//	  taking turns; sessions moved onto
//	  consecutive KV streams (llamacpp.streams)
//	a session reserves its stated length at     --max-sessions,            shardd.sessions.admitted,            TestReservedAdmission
//	  its first prefill or is refused             --ctx-tokens               shardd.sessions.refused
//	  (retryable)
//	an admitted session's step takes cells      --evict-grace              shardd.sessions.preempted,           TestAdmittedSessionsOutgrowKV,
//	  from idle sessions (declared CACHE_MISS)                             shardd.sessions.reprefilled,         sched/testdata/eviction_spares_queued_work
//	  and never from one with queued work                                  shardd.evictions
//	a full queue refuses, never blocks          --max-queue                shardd.queue.depth                   TestQueueFull
//	repeated steps answered from the results    --results-cache-bytes      shardd.results.bytes                 TestOnlyRecentResultsKept,
//	  cache, never re-applied                                                                                   sched/testdata/cancel_and_duplicate
//	a newer epoch supersedes; an older one is   -                          shardd.errors                        TestNewerEpochSupersedes
//	  EPOCH_STALE
//	idle sessions expire                        --session-ttl              shardd.evictions                     TestEvictedSessionMisses
//	draining with handoff refuses the open      --drain-handoff            shardd.errors                        TestDrainHandoff
//	  sessions' steps too (retryable), so
//	  heads move them to a standby
//	repeated prompt blocks answered from the    --prefix-cache-bytes,      shardd.prefix.hits,                  TestPrefixCacheIdentity,
//	  prefix cache, bounded in bytes, never     --prefix-block             shardd.prefix.tokens,                TestPrefixCacheBounded
//	  across identities                                                    shardd.prefix.bytes
//	prefix entries hold only positions whose   -                          shardd.prefix.unordered              TestPrefixCacheChurn
//	  cells the sequence holds in position
//	  order, cut to whole blocks
//
// The prefix cache (sched/prefix.go) answers a prompt's rows with the bits that a
// forward computes for a session alone in the KV buffer. An entry is made
// only of the positions whose cells the sequence holds, each laid in
// position order (backend.SeqStater.SeqInOrder), cut to its whole blocks
// (SeqCut). Attention sums a row's cells in cache order, and every other
// operation of the forward is batch-invariant (backend/llamacpp pins it), so those
// rows were computed as a lone run computes them, whatever else shared
// their forwards; positions past a session's first cell laid out of order
// (a shared buffer does that when sessions come and go) are not cached,
// and neither are rows a chain was fed but that never ran. Loaded into a
// session alone (no other session holding cells: the buffer restarts at
// cell 0 when it empties), an entry's cells lie in order again and the
// session goes on as the whole model would. In the exact mode each
// session has a stream of its own, where its cells always lie in order.
// Under -tags invariants the driver checks after every iteration that each
// session's position is where its cells end (check_positions.go).
//
// The scheduler is a state with a driver, as etcd's raft is built. The
// state is package engine/sched: a pure core that imports neither gRPC nor
// the backend (its TestImports), knows sessions by id and work items by a
// handle (sched.Item, which the engine's work embeds), and takes time only
// as the now each call is given. It changes only in Enqueue, the control
// calls, Plan(now), which returns the next forward to run, and
// Advance(now, outcome); each records what it asks of the world (replies,
// KV cells to trim, prefix saves and loads, items that leave the queue
// count) as sched.Effects instead of doing it. The driver (driver.go), one
// goroutine, takes in submitted work and control operations, runs the one
// forward (the only call that waits), appends the rows' outputs to their
// items (output.go), carries out the effects (apply) and publishes the
// state's figures to the metrics. It holds the state's lock (schedMu)
// except while it waits, on its channels or on the forward; a stream's
// Open reads admission under that lock instead of queueing behind the
// forward (one that would be refused for room while an operation, such as
// a release, is queued looks again behind it). The scripts
// (script_test.go) drive the driver the same way over a fake backend.
//
// Cache semantics are checked when work is dequeued, against the session
// store: the epoch (older: EPOCH_STALE; newer: supersedes the old state), the
// idempotency step (a repeat is acknowledged as a duplicate and its cached
// result sent again, never re-applied), and the cache expectation (a
// mismatch is a declared CACHE_MISS carrying actual_past_len).
package engine
