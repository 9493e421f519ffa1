// Package load is the latency-budget harness behind `shardd bench`: it puts
// a realistic load on a route of shardd workers and reports the figures
// that decide whether a deployment meets its budget.
//
// A run drives one Target (the head dials its addresses through the
// route client, exactly as a production head does) with a Workload: a
// closed loop of Concurrency requests in flight, or an open loop of
// Poisson arrivals at Rate per second; a number of requests or a
// duration; warm-up requests that are not counted; prompt and output
// lengths fixed, drawn uniformly from a range or from a file of pairs.
// Request i is a function of the seed and i alone, so every target of a
// comparison gets the same prompts and lengths, and runs repeat.
//
// What a run measures (Summary):
//   - per request: TTFT (arrival to first token; an open loop counts from
//     the scheduled arrival, so queueing at the head is in it), every
//     inter-token gap (ITL), TPOT (mean gap after the first token) and
//     end-to-end latency, each as an HdrHistogram (1 µs to 1 h, three
//     significant digits) summarised as p50/p90/p99/max/mean;
//   - output tokens/s and requests/s over the measured window (from the
//     first measured request to the last token), and the steady tokens/s:
//     the tokens emitted until the arrivals ended (the duration was up,
//     or the last request was issued), over that time, which leaves out
//     the drain after the last arrival (in a closed loop the sessions
//     move in cohorts, and where the cut falls among them moves the
//     drain's length and so tokens/s by itself);
//   - goodput: the share of requests that met every limit of the SLO
//     (errors count as misses), as vLLM's and AIPerf's goodput;
//   - per hop, for decode steps: the worker's own execution (the Ack's
//     execution_nanos) and the head's wait beyond it (wire: network,
//     framing, the worker's receive stages and queueing); prefill chunks'
//     execution separately;
//   - per stage, when the workers write span files: p50/p99 of each stage
//     span within the measured window, read with the telemetry package's
//     span reader (the code behind `shardd trace-report`), and each
//     worker's forwards: its busy share and the idle before its forwards,
//     charged to the kind of forward that ended the gap (a whole decode
//     group, part of one, decode with prompt rows, prompt rows alone:
//     telemetry.ForwardIdle), where a pipeline's bubbles show, and the
//     decode groups' crossings into each hop in parts (the sender's
//     frame-out, the relay through the head and the wire, the wait for
//     the hop's forward: telemetry.Crossings), where a bubble's time goes;
//   - errors by the worker's ErrorCode (or DEADLINE, CANCELED, TRANSPORT,
//     SHED), retries and re-prefills after a cache miss;
//   - the harness's own CPU time per generated token, so a reader can see
//     what it took from the workers' cores;
//   - on a Linux host that runs DAMON, the CPU time its kdamond used during
//     the run (forwards stall while it runs: a tail that grows with it is
//     the host's; see internal/hoststat).
//   - with RunOptions.ProbeCPUs (bench: the CPUs its workers are pinned
//     to), one core's memory read speed there before and after the run
//     (hoststat.ReadGBps): on a shared host it moves by up to 2x within
//     minutes, and a forward's time with it, so two runs of a comparison
//     made at different speeds show as such (the ceiling's host spread);
//   - for a target whose workers are pinned (Target.CPUs), each CPU's
//     speed sampled every 100 ms through the run (hoststat.SampleCores:
//     an L1 copy), which a forward's time follows where the read speed
//     stays flat (the ceiling's core pace), and the slower CPU's mean in
//     each second (Cores.Slowest: the ceiling's slow pace).
//
// Links put a toxiproxy proxy (in the harness's process, on loopback) in
// front of a hop's worker with added latency, jitter or a bandwidth cap. In shardd the head carries every activation, so a hop's
// link is the head-to-worker connection.
//
// The JSON report (Report, schema "shardd.bench/v1") is stable: fields are
// added, never renamed or given another meaning, under one schema name.
// Times are in milliseconds unless the field name says otherwise (_s, _us).
// Its top level: schema, started, command, workload (mode, concurrency
// levels or rate, requests, duration_s, warmup, prompt_len, output_len,
// prompts and prompt_tokens_p50 (real prompts, lengths in the model's
// tokens), sampling, seed, rounds, slo), targets (name, workers, ranges, threads,
// cpus, links), runs (one Summary per target, level and round, in the
// order run: see the json tags of Summary, Dist, HopSummary, HopIdle and
// HopCrossing), medians
// (per target and level over rounds: tokens/s, its spread, the ratio to
// the first target, TTFT and ITL p99, goodput), sweep (levels and knee),
// ceiling (--ceiling: route, baseline, hops and rows of concurrency, round
// (0: the medians), ratio, ceiling, share, host_spread, core_pace,
// core_spread and slow_pace; Ceiling says what they mean)
// and budget (each limit checked against each run of the first target)
// with budget_pass.
package load
