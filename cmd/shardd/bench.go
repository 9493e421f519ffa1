package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/internal/chat"
	"github.com/meshnet/shardd/load"
	"github.com/meshnet/shardd/route"
)

func init() {
	register(command{name: "bench", summary: "put a load on a route and report latency, throughput and a budget verdict", run: runBench})
}

// listFlag is a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

const benchHelp = `Loads a route the way operators run it and reports TTFT, inter-token latency (ITL), time per
output token (TPOT) and end-to-end latency (p50/p90/p99/max, HdrHistogram), output tokens/s
(to the last token, and steady: until the arrivals ended), requests/s, goodput under --slo,
per-hop execution and wire time, per-stage latency and each worker's idle between forwards (by
the kind of forward that ended it) from worker spans, errors by ErrorCode, and the harness's own
CPU time per token. For the workers it starts, also each one's share of the run in forward
calls, rows per forward and cost model (from their metrics), and, where they are pinned
(--worker-cpus, --unsplit-cpus), one core's memory read speed on their CPUs before and after
each run, each of a target's CPUs' speed sampled every 100 ms through its run (an L1 copy), and
the share of the run each waited for the host (steal): on a shared host they move, and a
forward's time with them.

Target: an existing route (--route A,B,...), or a route it starts from a model (--model FILE with
--shards N [--by cost [--kv-cells N]] or --ranges 0:8,8:12, cut as 'shardd split' cuts): one
'shardd serve' per shard on 127.0.0.1, each with its --threads and --worker-cpus, stopped
afterwards (also on Ctrl-C). --unsplit adds the whole model in one worker as a baseline, run in
interleaved rounds (--rounds) with the same requests; --ceiling also runs it at c/N sessions for
an N-hop route and reports route / whole against N x whole(c/N) / whole(c), the most N decode
groups can give (balanced hops, no idle, free crossings), read in the same round, with how far
the host's read speed moved across the round's runs and the pace the route's cores allowed
against the whole model's.

Budget (--budget FILE, .yaml or .toml; nested keys flatten with dots): limits on
  ttft|itl|tpot|e2e.STAT           e.g. itl.p99: 25ms
  hop[I].exec|wire|prefill_exec.STAT  decode steps on hop I (from 0), e.g. hop[1].wire.p99: 1ms
  stage.NAME.STAT, hop[I].stage.NAME.STAT  worker span stages (decode, reassemble, checksum,
                                   decompress, queue, forward, frameout, step); needs --stages
                                   or --span-files
  hop[I].busy                      hop I's share of the time in forwards, a lower bound from 0 to 1,
                                   e.g. hop[1].busy: 0.9; needs --stages or --span-files
  goodput, tokens_per_s, requests_per_s   (lower bounds)   error_rate, harness_cpu_per_token_us
STAT is p50, p90, p99, max or mean. Exit status 1 when any limit fails on any run of the first
target, with a table of each failing limit and by how much.

Links (--link HOP=COND,..., repeatable; HOP from 0 or 'all'): a toxiproxy proxy on loopback in
front of that hop's worker, on the first target only: latency:DUR (each way, whole ms),
jitter:DUR, bandwidth:RATE (1gbit, 100mbit, 10mbyte...). Periodic resets and stalls are not
offered (load/links.go says why).

Relayed hops (--relay-hops 1, or 0,2, or all; with --model): the harness runs a relay on
loopback in its own process (as shardd relay; --relay-latency), the workers of those hops also
register there, and a second target 'route+relay' drives the same workers with those hops
through the relay, in interleaved rounds with the direct 'route': the ratio column is the
relay's cost. A route you run takes relay://HOST:PORT/NAME hops in --route.`

// pipelineChunksHelp is --pipeline-chunks' help (route.Options.PipelineChunks).
const pipelineChunksHelp = "cut every prompt into at least this many chunks (a token each when shorter), pipelined through the route's hops, hop i+1 on a chunk while hop i runs the next: a long prompt's first token comes sooner (512 tokens on 2 hops with 4: 1.4x), and sessions that start together keep every hop busy; a prompt's rows then differ in their last bits from a whole prompt's outside --exact (0: the prefill chunks as they are, pipelined; -1: each chunk through every hop before the next)"

// benchFlags are bench's flags as given; parseBench turns them into a
// benchConfig.
type benchFlags struct {
	route, model, threads, workerCPUs, unsplitThreads, unsplitCPUs, serveArgs, spanFiles string
	promptLen, outputLen, lengths, prompts, tokenizer, sweep, slo, budget, relayHops     string
	json, html, compact, workDir                                                         string
	unsplit, ceiling, stages, quiet                                                      bool
	concurrency, requests, warmup, topK, rounds, prefixes, prefixLen, turns              int
	rate, temperature, topP, burstiness                                                  float64
	duration, relayLatency, stepTimeout                                                  time.Duration
	seed                                                                                 uint64
	links, openai                                                                        listFlag
	apiKey, kill                                                                         string
	standbys, pipeChunks                                                                 int
	vocab                                                                                int
	cut                                                                                  cutFlags
	tls                                                                                  *tlsFlags
}

// benchConfig is a checked bench command line: everything the run needs is
// known before a worker starts.
type benchConfig struct {
	f          benchFlags
	args       []string
	w          load.Workload
	levels     []float64
	sweepParam string
	budget     load.Budget
	// probeCPUs are the CPUs the started workers are pinned to, whose
	// memory read speed each run probes (none: not pinned, or --route).
	probeCPUs []int
}

func (f *benchFlags) addTargetFlags(fs *flag.FlagSet) {
	fs.StringVar(&f.route, "route", "", "existing route: "+routeHelp)
	fs.Var(&f.openai, "openai", "an OpenAI-compatible server as a target, [NAME=]URL (shardd api, llama-server, vLLM: http://HOST:PORT); repeatable, and beside --route or --model in interleaved rounds")
	fs.StringVar(&f.apiKey, "api-key", os.Getenv("OPENAI_API_KEY"), "bearer key for --openai servers (default $OPENAI_API_KEY)")
	fs.IntVar(&f.vocab, "vocab", 0, "vocabulary the random prompt ids are drawn from (default: the route's, or an --openai server's /v1/models meta.n_vocab)")
	f.tls = addClientTLS(fs)
	fs.StringVar(&f.model, "model", "", "whole-model GGUF: the harness splits it and starts the workers")
	f.cut = addCutFlags(fs, "with --model: ")
	fs.StringVar(&f.threads, "threads", "1", "with --model: forward threads per worker, one value or one per worker (1,1)")
	fs.StringVar(&f.workerCPUs, "worker-cpus", "", "with --model: CPU set per worker, ';' between workers (0;1 or 0-1;2-3); empty: no pinning")
	fs.BoolVar(&f.unsplit, "unsplit", false, "with --model: also run the whole model in one worker, as the baseline")
	fs.StringVar(&f.unsplitThreads, "unsplit-threads", "1", "threads of the --unsplit worker; a list (1,2) makes one baseline per value")
	fs.StringVar(&f.unsplitCPUs, "unsplit-cpus", "", "CPU set of each --unsplit worker, ';' between them (0 or 0;0-1)")
	fs.BoolVar(&f.ceiling, "ceiling", false, "with --unsplit and a timed closed loop (--duration) at c (a multiple of the hop count N): each round also runs the baseline with the hops' thread count at c/N, and the report gives route / whole against its ceiling, N x whole(c/N) / whole(c), round by round")
	fs.StringVar(&f.serveArgs, "serve-args", "", "further flags for every 'shardd serve' the harness starts (space-separated)")
	fs.BoolVar(&f.stages, "stages", false, "with --model: workers write spans, and the report has per-stage latency, each worker's busy share and idle between forwards, by what came next (a whole decode group, part of one, prompt rows), and the decode groups' crossings into each hop in parts (the sender's frame-out, the relay through the head and the wire, the wait for the hop's forward)")
	fs.IntVar(&f.standbys, "standbys", 0, "with --model: also start this many standby workers per shard, which a hop whose worker fails moves to")
	fs.StringVar(&f.kill, "kill", "", "with --model: kill (SIGKILL) hop HOP's worker DUR into each measured run of the route, and start it again on its address after restart=DUR (default: when the run ends): HOP@DUR[,restart=DUR], e.g. 1@3s")
	fs.StringVar(&f.spanFiles, "span-files", "", "with --route: span files the workers write (serve --traces file:PATH, --instance = the address given in --route), for per-stage latency, idle between forwards and crossings (as --stages)")
	fs.StringVar(&f.relayHops, "relay-hops", "", "with --model: also run the route with these hops (0,1,... or all) through a relay the harness runs, as a target 'route+relay' on the same workers, interleaved with the direct route")
	fs.DurationVar(&f.relayLatency, "relay-latency", 0, "with --relay-hops: delay the relay adds to every chunk, each way")
	fs.Var(&f.links, "link", "network condition of a hop, HOP=latency:5ms,jitter:1ms,bandwidth:1gbit (repeatable)")
	fs.StringVar(&f.compact, "compact-logits", "off", "on: ask the last hop for the best K logits only where sampling needs no more (greedy: K=1; --top-k k: K=k) instead of the whole vocabulary's, the same tokens; both: also a target 'route+compact' on the route's workers and --link proxies, in interleaved rounds with 'route'")
	fs.DurationVar(&f.stepTimeout, "step-timeout", 60*time.Second, "deadline of one step on one worker")
	fs.IntVar(&f.pipeChunks, "pipeline-chunks", 0, pipelineChunksHelp)
}

func (f *benchFlags) addWorkloadFlags(fs *flag.FlagSet) {
	fs.IntVar(&f.concurrency, "concurrency", 4, "closed loop: requests in flight")
	fs.Float64Var(&f.rate, "rate", 0, "open loop: Poisson arrivals per second (overrides --concurrency)")
	fs.Float64Var(&f.burstiness, "burstiness", 1, "with --rate: shape of the gamma distribution of arrival gaps: 1 is Poisson, below 1 burstier (bursts of arrivals, then lulls), above 1 steadier")
	fs.IntVar(&f.prefixes, "shared-prefixes", 0, "N shared system prompts of --prefix-len tokens: every request starts with one of them, then its own --prompt-len tokens (vLLM's prefix repetition)")
	fs.IntVar(&f.prefixLen, "prefix-len", 512, "with --shared-prefixes: tokens of each shared prompt")
	fs.IntVar(&f.turns, "turns", 0, "multi-turn conversations of this many turns: each turn resends the whole history (earlier prompts and answers) plus a new --prompt-len message (or the next of --prompts); --requests counts turns, and the report gives TTFT by turn")
	fs.IntVar(&f.requests, "requests", 0, "measured requests per run (default 40 when --duration is not set)")
	fs.DurationVar(&f.duration, "duration", 0, "measured time per run (arrivals stop, requests in flight finish)")
	fs.IntVar(&f.warmup, "warmup", -1, "requests run first and not counted (-1: as many as the concurrency)")
	fs.StringVar(&f.promptLen, "prompt-len", "128", "prompt tokens: N or MIN-MAX (uniform)")
	fs.StringVar(&f.outputLen, "output-len", "64", "output tokens: N or MIN-MAX (uniform)")
	fs.StringVar(&f.lengths, "lengths", "", "file of 'PROMPT OUTPUT' pairs, one a line; requests draw from it")
	fs.StringVar(&f.prompts, "prompts", "", "JSONL of real prompts ({\"prompt\": TEXT} or {\"messages\": [...]}, e.g. "+load.DefaultPrompts+"), tokenized with the model's tokenizer (chat messages through its chat template); request i sends prompt i mod N, --output-len tokens")
	fs.StringVar(&f.tokenizer, "tokenizer", "", "with --prompts: the GGUF whose tokenizer and chat template to use (default: --model; with --route, the route's first shard or the whole model)")
	fs.Float64Var(&f.temperature, "temperature", 0, "sampling temperature (0: greedy)")
	fs.IntVar(&f.topK, "top-k", 0, "sampling top-k (0: all)")
	fs.Float64Var(&f.topP, "top-p", 0, "sampling top-p (0: off)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of lengths, prompts, arrivals and sampling: runs repeat")
	fs.StringVar(&f.sweep, "sweep", "", "sweep the load: concurrency=1,2,4,8 or rate=1,2,4")
	fs.IntVar(&f.rounds, "rounds", 1, "rounds of every target and level, interleaved; the report gives medians")
	fs.StringVar(&f.slo, "slo", "", "per-request SLO for goodput: ttft=300ms,itl=25ms,tpot=20ms,e2e=5s")
}

func (f *benchFlags) addOutputFlags(fs *flag.FlagSet) {
	fs.StringVar(&f.budget, "budget", "", "budget file (.yaml or .toml): exit 1 when a limit fails")
	fs.StringVar(&f.json, "json", "", "write the report as JSON (schema "+load.Schema+")")
	fs.StringVar(&f.html, "html", "", "write the report as one self-contained HTML page with plots")
	fs.BoolVar(&f.quiet, "quiet", false, "no live progress line")
	fs.StringVar(&f.workDir, "work-dir", "", "where worker logs and spans go (default: a temporary folder, removed afterwards)")
}

// parseBench parses and checks bench's command line, reading the files it
// names (lengths, prompts, budget); it starts nothing.
func parseBench(args []string) (*benchConfig, error) {
	fs := newFlags("bench", "(--route A,B,... | --model FILE (--shards N | --ranges R)) [flags]", benchHelp)
	c := &benchConfig{args: args}
	f := &c.f
	f.addTargetFlags(fs)
	f.addWorkloadFlags(fs)
	f.addOutputFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if (f.route != "" && f.model != "") || (f.route == "" && f.model == "" && len(f.openai) == 0) {
		fs.Usage()
		return nil, fmt.Errorf("give --route or --model (not both), and/or --openai")
	}
	if err := f.checkTarget(); err != nil {
		return nil, err
	}
	if err := c.workload(); err != nil {
		return nil, err
	}
	return c, nil
}

// checkTarget checks the flags that choose and shape the targets.
func (f *benchFlags) checkTarget() error {
	if !slices.Contains([]string{"off", "on", "both"}, f.compact) {
		return fmt.Errorf("--compact-logits %q: want off, on or both", f.compact)
	}
	if f.route != "" && (f.unsplit || *f.cut.shards > 0 || *f.cut.rangesFlag != "" || *f.cut.by != "layers" || *f.cut.kvCells != 0 || f.stages || f.relayHops != "" || f.standbys > 0 || f.kill != "") {
		return fmt.Errorf("--unsplit, --shards, --ranges, --by, --kv-cells, --stages, --relay-hops, --standbys and --kill need --model (the harness starts those workers); a route you run takes relay://HOST:PORT/NAME hops and a|a2 standbys in --route")
	}
	if f.ceiling && (!f.unsplit || f.rate > 0 || strings.HasPrefix(f.sweep, "rate=") || f.duration <= 0) {
		// A count of requests would give the runs at c and c/N different
		// numbers of turnovers; a duration gives them the same share.
		return fmt.Errorf("--ceiling needs --unsplit and a timed closed loop (--duration; --concurrency or --sweep concurrency=, no --rate)")
	}
	if f.route == "" && (*f.tls.ca != "" || *f.tls.cert != "") {
		return fmt.Errorf("the TLS flags are for --route: the workers --model starts listen on loopback in plaintext")
	}
	if f.relayLatency < 0 {
		return fmt.Errorf("--relay-latency must not be negative")
	}
	if f.rounds < 1 {
		return fmt.Errorf("--rounds must be at least 1")
	}
	return nil
}

// workload builds the load from the flags: lengths or prompts, sampling,
// SLO, sweep levels and budget.
func (c *benchConfig) workload() error {
	f := &c.f
	w := load.Workload{Concurrency: f.concurrency, Rate: f.rate, Requests: f.requests, Duration: f.duration, Seed: f.seed, Vocab: f.vocab,
		Sampling: route.Sampling{Temperature: f.temperature, TopK: f.topK, TopP: f.topP, Seed: f.seed},
		Prefixes: f.prefixes, PrefixLen: f.prefixLen, Turns: f.turns, Burstiness: f.burstiness}
	if f.prefixes < 0 || f.prefixLen < 1 || f.turns < 0 || f.burstiness <= 0 {
		return fmt.Errorf("--shared-prefixes and --turns must not be negative, --prefix-len and --burstiness must be positive")
	}
	if w.Requests == 0 && w.Duration == 0 {
		w.Requests = 40
	}
	var err error
	switch {
	case f.prompts != "" && f.lengths != "":
		return fmt.Errorf("give --prompts or --lengths, not both")
	case f.prompts != "":
		tok := f.tokenizer
		if tok == "" {
			tok = f.model
		}
		if w.Prompts, err = tokenizePromptFile(f.prompts, tok); err != nil {
			return err
		}
		w.Lengths.Output, err = load.ParseRange(f.outputLen)
	case f.lengths != "":
		w.Lengths.Pairs, err = load.ReadLengthFile(f.lengths)
	default:
		if w.Lengths.Prompt, err = load.ParseRange(f.promptLen); err == nil {
			w.Lengths.Output, err = load.ParseRange(f.outputLen)
		}
	}
	if err != nil {
		return err
	}
	if w.SLO, err = load.ParseSLO(f.slo); err != nil {
		return err
	}
	if f.budget != "" {
		if c.budget, err = load.ReadBudget(f.budget); err != nil {
			return err
		}
	}
	c.w = w
	c.sweepParam, c.levels, err = parseSweep(f.sweep, w)
	return err
}

func runBench(args []string) error {
	c, err := parseBench(args)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir := c.f.workDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "shardd-bench-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rep := &load.Report{Schema: load.Schema, Started: time.Now(), Command: "shardd bench " + strings.Join(args, " ")}
	targets, closeAll, err := c.targets(ctx, dir, rep)
	defer closeAll()
	if err != nil {
		return err
	}
	rep.Workload = workloadInfo(c.w, c.levels, c.sweepParam, c.f.rounds, c.f.warmup)
	if err := c.runRounds(ctx, targets, rep); err != nil {
		return err
	}
	return c.report(rep)
}

// targets starts or names the targets, with --link proxies in front of the
// first and the compact view of it; closeAll stops what was started.
func (c *benchConfig) targets(ctx context.Context, dir string, rep *load.Report) (targets []load.Target, closeAll func(), err error) {
	var closers []func()
	closeAll = func() {
		for _, f := range slices.Backward(closers) {
			f()
		}
	}
	switch {
	case c.f.route != "":
		addrs, alts, err := route.ParseRoute(c.f.route)
		if err != nil {
			return nil, closeAll, err
		}
		t := load.Target{Name: "route", Addrs: addrs, Workers: addrs, Alternates: alts}
		if c.f.spanFiles != "" {
			t.SpanFiles, t.SpanFlush = splitList(c.f.spanFiles), 6*time.Second
		}
		targets = []load.Target{t}
		rep.Targets = []load.TargetInfo{{Name: t.Name, Workers: addrs}}
	case c.f.model != "":
		sp, stop, err := c.spawn(ctx, dir)
		closers = append(closers, stop)
		if err != nil {
			return nil, closeAll, err
		}
		targets, rep.Targets = sp.Targets, sp.Infos
	}
	defer func() {
		for i, v := range c.f.openai {
			name, url, ok := strings.Cut(v, "=")
			if !ok || strings.Contains(name, "/") {
				name, url = "openai", v
				if i > 0 {
					name = fmt.Sprintf("openai%d", i+1)
				}
			}
			targets = append(targets, load.Target{Name: name, OpenAI: url, APIKey: c.f.apiKey})
			rep.Targets = append(rep.Targets, load.TargetInfo{Name: name, Workers: []string{url}})
		}
	}()
	if len(targets) == 0 {
		if len(c.f.links) > 0 || c.f.compact == "both" {
			return nil, closeAll, fmt.Errorf("--link and --compact-logits both need a route target (--route or --model)")
		}
		return nil, closeAll, nil
	}
	hopLinks, err := load.ParseLinks(c.f.links, len(targets[0].Addrs))
	if err != nil {
		return nil, closeAll, err
	}
	addrs, proxies, err := load.StartLinks(targets[0].Addrs, hopLinks)
	if err != nil {
		return nil, closeAll, err
	}
	closers = append(closers, func() { proxies.Close() })
	targets[0].Addrs = addrs
	rep.Targets[0].Links = c.f.links
	if c.f.compact == "both" {
		// The same workers through the same links, asking for compact output.
		ct, ci := targets[0], rep.Targets[0]
		ct.Name, ci.Name, ct.CompactLogits, ct.Kill = "route+compact", "route+compact", true, nil
		ct.Addrs = slices.Clone(ct.Addrs)
		targets = slices.Insert(targets, 1, ct)
		rep.Targets = slices.Insert(rep.Targets, 1, ci)
	}
	return targets, closeAll, nil
}

// spawn splits the model and starts the route's workers, the relay and the
// baselines (load.StartTargets); stop stops them.
func (c *benchConfig) spawn(ctx context.Context, dir string) (*load.Spawned, func(), error) {
	var closers []func()
	stop := func() {
		for _, f := range slices.Backward(closers) {
			f()
		}
	}
	sp, err := c.spawnSpec(dir)
	if err != nil {
		return nil, stop, err
	}
	if c.f.relayHops != "" {
		rl, err := load.StartRelay(c.f.relayLatency)
		if err != nil {
			return nil, stop, err
		}
		closers = append(closers, func() { rl.Close() })
		if sp.Relayed, err = rl.Hops(c.f.relayHops, len(sp.Shards)); err != nil {
			return nil, stop, err
		}
	}
	started, err := load.StartTargets(ctx, sp)
	if err != nil {
		return nil, stop, err
	}
	closers = append(closers, started.Close)
	return started, stop, nil
}

// spawnSpec reads the cut, thread and CPU flags into what to start, and
// splits the model (cached).
func (c *benchConfig) spawnSpec(dir string) (load.Spawn, error) {
	f := &c.f
	sp := load.Spawn{Bin: selfPath(), Model: f.model, Stages: f.stages, Dir: dir,
		ServeArgs: append(load.SessionArgs(c.w, c.levels, c.sweepParam), strings.Fields(f.serveArgs)...)}
	var err error
	if sp.Ranges, err = f.cut.ranges(f.model); err != nil {
		return sp, err
	}
	sp.Standbys = f.standbys
	if sp.Kill, err = parseKill(f.kill); err != nil {
		return sp, err
	}
	if sp.Threads, err = perWorkerInts(f.threads, len(sp.Ranges)); err != nil {
		return sp, err
	}
	if sp.CPUs, err = load.ParseCPUSets(f.workerCPUs); err != nil {
		return sp, err
	}
	if len(sp.CPUs) > 0 && len(sp.CPUs) != len(sp.Ranges) {
		return sp, fmt.Errorf("--worker-cpus has %d sets for %d workers", len(sp.CPUs), len(sp.Ranges))
	}
	if f.unsplit {
		if sp.Baselines, err = baselines(f.unsplitThreads, f.unsplitCPUs); err != nil {
			return sp, err
		}
	}
	c.probeCPUs = pinnedCPUs(sp)
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	sp.Shards, err = load.Shards(f.model, sp.Ranges, filepath.Join(cache, "shardd", "bench-shards"))
	return sp, err
}

// pinnedCPUs is the union of the CPUs sp pins its workers to, in order.
func pinnedCPUs(sp load.Spawn) []int {
	var out []int
	for _, set := range sp.CPUs {
		out = append(out, set...)
	}
	for _, b := range sp.Baselines {
		out = append(out, b.CPUs...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// parseKill reads --kill HOP@DUR[,restart=DUR] ("": none).
func parseKill(v string) (*load.KillPlan, error) {
	if v == "" {
		return nil, nil
	}
	bad := fmt.Errorf("--kill %q: want HOP@DUR[,restart=DUR], e.g. 1@3s,restart=10s", v)
	first, rest, _ := strings.Cut(v, ",")
	hop, at, ok := strings.Cut(first, "@")
	k := &load.KillPlan{}
	var err error
	if k.Hop, err = strconv.Atoi(hop); !ok || err != nil || k.Hop < 0 {
		return nil, bad
	}
	if k.At, err = time.ParseDuration(at); err != nil || k.At <= 0 {
		return nil, bad
	}
	if rest != "" {
		d, ok := strings.CutPrefix(rest, "restart=")
		if k.Restart, err = time.ParseDuration(d); !ok || err != nil || k.Restart <= 0 {
			return nil, bad
		}
	}
	return k, nil
}

// baselines reads --unsplit-threads and --unsplit-cpus.
func baselines(threads, cpus string) ([]load.Baseline, error) {
	sets, err := load.ParseCPUSets(cpus)
	if err != nil {
		return nil, err
	}
	var out []load.Baseline
	for _, v := range splitList(threads) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--unsplit-threads: bad value %q", v)
		}
		out = append(out, load.Baseline{Threads: n})
	}
	if len(sets) > 0 && len(sets) != len(out) {
		return nil, fmt.Errorf("--unsplit-cpus has %d sets for %d baselines", len(sets), len(out))
	}
	for i := range sets {
		out[i].CPUs = sets[i]
	}
	return out, nil
}

// runRounds runs every target at every level, round after round, so the
// targets see the same machine conditions.
func (c *benchConfig) runRounds(ctx context.Context, targets []load.Target, rep *load.Report) error {
	opts := load.RunOptions{Route: route.Options{StepTimeout: c.f.stepTimeout, CompactLogits: c.f.compact == "on", PipelineChunks: c.f.pipeChunks},
		ProbeCPUs: c.probeCPUs}
	if c.f.route != "" {
		var err error
		if _, _, opts.Route.TLS, err = routeSpec(c.f.route, c.f.tls); err != nil {
			return err
		}
	}
	if !c.f.quiet {
		opts.Progress = os.Stderr
	}
	ceiling, err := c.ceilingRuns(targets, rep)
	if err != nil {
		return err
	}
	for round := 1; round <= c.f.rounds; round++ {
		for _, lvl := range c.levels {
			lw := c.w
			if c.sweepParam == "rate" {
				lw.Rate = lvl
			} else if c.w.Rate == 0 {
				lw.Concurrency = int(lvl)
			}
			lw.Warmup = c.f.warmup
			if lw.Warmup < 0 {
				lw.Warmup = max(lw.Concurrency, 1)
			}
			type run struct {
				t load.Target
				w load.Workload
			}
			var runs []run
			for _, t := range targets {
				runs = append(runs, run{t, lw})
			}
			if ceiling != nil && !slices.Contains(c.levels, float64(lw.Concurrency/ceiling.hops)) {
				// The baseline at c/N beside the others at c, unless the
				// sweep runs that level anyway.
				hw := lw
				hw.Concurrency /= ceiling.hops
				runs = append(runs, run{ceiling.baseline, hw})
			}
			for _, r := range runs {
				opts.Label = runLabel(r.t.Name, r.w, round, c.f.rounds)
				s, err := load.Run(ctx, r.t, r.w, opts)
				if err != nil {
					return err
				}
				s.Round = round
				rep.Runs = append(rep.Runs, s)
			}
		}
	}
	return nil
}

// ceilingRun is what --ceiling runs besides the targets: the baseline
// with as many threads as each hop has, at c / hops.
type ceilingRun struct {
	baseline load.Target
	hops     int
}

// ceilingRuns checks --ceiling against the targets started and sets the
// report up for it (nil: no --ceiling).
func (c *benchConfig) ceilingRuns(targets []load.Target, rep *load.Report) (*ceilingRun, error) {
	if !c.f.ceiling {
		return nil, nil
	}
	hops := len(targets[0].Addrs)
	if hops < 2 || !slices.ContainsFunc(targets, func(t load.Target) bool { return strings.HasPrefix(t.Name, "unsplit") }) {
		return nil, fmt.Errorf("--ceiling needs a route of 2 or more hops and an --unsplit baseline")
	}
	// The bound compares a hop's forward with the whole model's on as many
	// threads: the baseline must have the threads each hop has.
	threads := func(name string) []int {
		for _, ti := range rep.Targets {
			if ti.Name == name {
				return ti.Threads
			}
		}
		return nil
	}
	per := slices.Compact(slices.Clone(threads(targets[0].Name)))
	if len(per) != 1 {
		return nil, fmt.Errorf("--ceiling needs the route's hops on one thread count each (--threads), not %v", threads(targets[0].Name))
	}
	i := slices.IndexFunc(targets, func(t load.Target) bool {
		return strings.HasPrefix(t.Name, "unsplit") && slices.Equal(threads(t.Name), per)
	})
	if i < 0 {
		return nil, fmt.Errorf("--ceiling needs an --unsplit baseline on %d thread(s), as each hop has (--unsplit-threads)", per[0])
	}
	for _, lvl := range c.levels {
		if conc := int(lvl); conc%hops != 0 {
			return nil, fmt.Errorf("--ceiling: concurrency %d is not a multiple of the route's %d hops", conc, hops)
		}
	}
	rep.Ceiling = &load.Ceiling{Route: targets[0].Name, Baseline: targets[i].Name, Hops: hops}
	return &ceilingRun{baseline: targets[i], hops: hops}, nil
}

// report prints the report, writes the JSON and HTML asked for, and fails
// when the budget does.
func (c *benchConfig) report(rep *load.Report) error {
	rep.Finish(c.budget, c.sweepParam)
	fmt.Println()
	rep.WriteText(os.Stdout)
	if c.f.json != "" {
		if err := rep.WriteJSON(c.f.json); err != nil {
			return err
		}
		fmt.Printf("wrote %s\n", c.f.json)
	}
	if c.f.html != "" {
		if err := rep.WriteHTML(c.f.html); err != nil {
			return err
		}
		fmt.Printf("wrote %s\n", c.f.html)
	}
	if !rep.BudgetPass {
		return errBudget
	}
	return nil
}

var errBudget = errors.New("the budget failed (see the table above)")

func runLabel(target string, w load.Workload, round, rounds int) string {
	l := target
	if w.Rate > 0 {
		l += fmt.Sprintf(" rate=%g", w.Rate)
	} else {
		l += fmt.Sprintf(" c=%d", w.Concurrency)
	}
	if rounds > 1 {
		l += fmt.Sprintf(" r%d", round)
	}
	return l
}

// parseSweep reads --sweep; without one the single level is the workload's.
func parseSweep(s string, w load.Workload) (string, []float64, error) {
	if s == "" {
		if w.Rate > 0 {
			return "", []float64{w.Rate}, nil
		}
		return "", []float64{float64(w.Concurrency)}, nil
	}
	param, list, ok := strings.Cut(s, "=")
	if !ok || (param != "concurrency" && param != "rate") {
		return "", nil, fmt.Errorf("--sweep: want concurrency=1,2,4 or rate=1,2,4")
	}
	if param == "concurrency" && w.Rate > 0 {
		return "", nil, fmt.Errorf("--sweep concurrency= is a closed loop; drop --rate")
	}
	var levels []float64
	for _, v := range splitList(list) {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 || (param == "concurrency" && f != float64(int(f))) {
			return "", nil, fmt.Errorf("--sweep: bad level %q", v)
		}
		levels = append(levels, f)
	}
	if len(levels) == 0 {
		return "", nil, fmt.Errorf("--sweep: no levels")
	}
	return param, levels, nil
}

func workloadInfo(w load.Workload, levels []float64, sweepParam string, rounds, warmup int) load.WorkloadInfo {
	wi := load.WorkloadInfo{Mode: "closed", Rate: w.Rate, Requests: w.Requests, DurationS: w.Duration.Seconds(), Warmup: warmup,
		PromptLen: w.PromptLens(), OutputLen: w.Lengths.Output, LengthPairs: len(w.Lengths.Pairs), Prompts: len(w.Prompts),
		Temperature: w.Sampling.Temperature, TopK: w.Sampling.TopK, TopP: w.Sampling.TopP, Seed: w.Seed, Rounds: rounds, SLO: w.SLO.String(),
		Prefixes: w.Prefixes, Turns: w.Turns}
	if w.Prefixes > 0 {
		wi.PrefixLen = w.PrefixLen
	}
	if w.Rate > 0 || sweepParam == "rate" {
		wi.Burstiness = w.Burstiness
	}
	if len(w.Prompts) > 0 {
		lens := make([]int, len(w.Prompts))
		for i, p := range w.Prompts {
			lens[i] = len(p)
		}
		slices.Sort(lens)
		wi.PromptTokensP50 = lens[len(lens)/2]
	}
	if w.Rate > 0 || sweepParam == "rate" {
		wi.Mode = "open"
	}
	if wi.Mode == "closed" {
		for _, l := range levels {
			wi.Concurrency = append(wi.Concurrency, int(l))
		}
	}
	return wi
}

// tokenizePromptFile reads a prompts file and tokenizes each prompt with
// the tokenizer of the GGUF at tokPath: text as it is, chat messages
// through the model's chat template.
func tokenizePromptFile(path, tokPath string) ([][]int32, error) {
	ps, err := load.ReadPromptFile(path)
	if err != nil {
		return nil, err
	}
	if tokPath == "" {
		return nil, fmt.Errorf("--prompts needs the model's tokenizer: give --tokenizer FILE.gguf (the whole model or the route's first shard)")
	}
	tok, err := llamacpp.OpenTokenizer(tokPath)
	if err != nil {
		return nil, err
	}
	defer tok.Close()
	out := make([][]int32, len(ps))
	for i, p := range ps {
		text := p.Text
		if len(p.Messages) > 0 {
			msgs := make([]llamacpp.Message, len(p.Messages))
			for j, m := range p.Messages {
				msgs[j] = llamacpp.Message{Role: m.Role, Content: m.Content}
			}
			if text, _, err = chat.Render(tok, msgs, ""); err != nil {
				return nil, err
			}
		}
		if out[i], err = tok.Encode(text); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func perWorkerInts(s string, n int) ([]int, error) {
	parts := splitList(s)
	if len(parts) != 1 && len(parts) != n {
		return nil, fmt.Errorf("--threads: give one value or %d", n)
	}
	out := make([]int, n)
	for i := range out {
		v, err := strconv.Atoi(parts[min(i, len(parts)-1)])
		if err != nil || v < 1 {
			return nil, fmt.Errorf("--threads: bad value %q", parts[min(i, len(parts)-1)])
		}
		out[i] = v
	}
	return out, nil
}

// selfPath is this executable, which the harness runs as 'serve'.
func selfPath() string {
	p, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return p
}
