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
// The scheduler runs iterations. Each iteration takes every waiting decode
// step first (one per session: continuous decode batching across sessions),
// then fills what is left of the iteration's token budget with prefill
// tokens, to the chunk with the fewest tokens left first (oldest first
// once a chunk has waited prefillPatience); a chunk larger than what is
// left progresses over several iterations. So a long prefill never delays
// a decode step by more than one bounded iteration, and sessions reach
// their first token one after another. The decode rows go in in the order
// of their sessions' KV sequences, so each session's cells keep a steady
// stride in the shared KV buffer. The decode budget bounds the prefill
// tokens beside decode rows, except when the prompts waiting outnumber the
// sessions decoding: then an iteration takes a full prefill iteration's
// tokens (promptsOutnumber), so a few fast decoders cannot starve them.
//
// The scheduler is a state with a driver, as etcd's raft is built. The
// state (scheduler.go: session queues, admission against the session
// store, the results cache, the cost model, the decode budget, the
// gathering rule) holds no backend, engine or clock of its own. It changes
// only in enqueue, the control operations, plan(now), which returns the
// next forward to run, and advance(outcome), which takes in how that
// forward went and its output; each records what it asks of the world
// (replies to deliver, KV cells to trim, items that leave the queue count)
// as effects instead of doing it. The driver (driver.go), one goroutine,
// takes in submitted work and control operations, runs the one forward
// (the only call that waits), carries out the effects (apply) and
// publishes the state's figures to the metrics. The clock is injected, so
// the scenarios in plan_test.go are short scripts with no goroutine, no
// sleep and no llama.cpp.
//
// Cache semantics are checked when work is dequeued, against the session
// store: the epoch (older: EPOCH_STALE; newer: supersedes the old state), the
// idempotency step (a repeat is acknowledged as a duplicate and its cached
// result sent again, never re-applied), and the cache expectation (a
// mismatch is a declared CACHE_MISS carrying actual_past_len).
package engine
