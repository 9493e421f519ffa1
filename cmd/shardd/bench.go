package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/load"
	"github.com/meshnet/shardd/relay"
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
per-hop execution and wire time, per-stage latency from worker spans, errors by ErrorCode, and
the harness's own CPU time per token.

Target: an existing route (--route A,B,...), or a route it starts from a model (--model FILE with
--shards N [--by cost [--kv-cells N]] or --ranges 0:8,8:12, cut as 'shardd split' cuts): one
'shardd serve' per shard on 127.0.0.1, each with its --threads and --worker-cpus, stopped
afterwards (also on Ctrl-C). --unsplit adds the whole model in one worker as a baseline, run in
interleaved rounds (--rounds) with the same requests.

Budget (--budget FILE, .yaml or .toml; nested keys flatten with dots): limits on
  ttft|itl|tpot|e2e.STAT           e.g. itl.p99: 25ms
  hop[I].exec|wire|prefill_exec.STAT  decode steps on hop I (from 0), e.g. hop[1].wire.p99: 1ms
  stage.NAME.STAT, hop[I].stage.NAME.STAT  worker span stages (decode, reassemble, checksum,
                                   decompress, queue, forward, frameout, step); needs --stages
                                   or --span-files
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

func runBench(args []string) error {
	fs := newFlags("bench", "(--route A,B,... | --model FILE (--shards N | --ranges R)) [flags]", benchHelp)
	routeFlag := fs.String("route", "", "existing route: worker addresses in layer order")
	tlsf := addClientTLS(fs)
	model := fs.String("model", "", "whole-model GGUF: the harness splits it and starts the workers")
	cut := addCutFlags(fs, "with --model: ")
	threads := fs.String("threads", "1", "with --model: forward threads per worker, one value or one per worker (1,1)")
	workerCPUs := fs.String("worker-cpus", "", "with --model: CPU set per worker, ';' between workers (0;1 or 0-1;2-3); empty: no pinning")
	unsplit := fs.Bool("unsplit", false, "with --model: also run the whole model in one worker, as the baseline")
	unsplitThreads := fs.String("unsplit-threads", "1", "threads of the --unsplit worker; a list (1,2) makes one baseline per value")
	unsplitCPUs := fs.String("unsplit-cpus", "", "CPU set of each --unsplit worker, ';' between them (0 or 0;0-1)")
	serveArgs := fs.String("serve-args", "", "further flags for every 'shardd serve' the harness starts (space-separated)")
	stages := fs.Bool("stages", false, "with --model: workers write spans, and the report has per-stage latency")
	spanFiles := fs.String("span-files", "", "with --route: span files the workers write (serve --traces file:PATH, --instance = the address given in --route), for per-stage latency")

	concurrency := fs.Int("concurrency", 4, "closed loop: requests in flight")
	rate := fs.Float64("rate", 0, "open loop: Poisson arrivals per second (overrides --concurrency)")
	requests := fs.Int("requests", 0, "measured requests per run (default 40 when --duration is not set)")
	duration := fs.Duration("duration", 0, "measured time per run (arrivals stop, requests in flight finish)")
	warmup := fs.Int("warmup", -1, "requests run first and not counted (-1: as many as the concurrency)")
	promptLen := fs.String("prompt-len", "128", "prompt tokens: N or MIN-MAX (uniform)")
	outputLen := fs.String("output-len", "64", "output tokens: N or MIN-MAX (uniform)")
	lengthFile := fs.String("lengths", "", "file of 'PROMPT OUTPUT' pairs, one a line; requests draw from it")
	promptFile := fs.String("prompts", "", "JSONL of real prompts ({\"prompt\": TEXT} or {\"messages\": [...]}, e.g. "+load.DefaultPrompts+"), tokenized with the model's tokenizer (chat messages through its chat template); request i sends prompt i mod N, --output-len tokens")
	tokenizer := fs.String("tokenizer", "", "with --prompts: the GGUF whose tokenizer and chat template to use (default: --model; with --route, the route's first shard or the whole model)")
	temperature := fs.Float64("temperature", 0, "sampling temperature (0: greedy)")
	topK := fs.Int("top-k", 0, "sampling top-k (0: all)")
	topP := fs.Float64("top-p", 0, "sampling top-p (0: off)")
	seed := fs.Uint64("seed", 1, "seed of lengths, prompts, arrivals and sampling: runs repeat")
	sweep := fs.String("sweep", "", "sweep the load: concurrency=1,2,4,8 or rate=1,2,4")
	rounds := fs.Int("rounds", 1, "rounds of every target and level, interleaved; the report gives medians")
	sloFlag := fs.String("slo", "", "per-request SLO for goodput: ttft=300ms,itl=25ms,tpot=20ms,e2e=5s")
	budgetFile := fs.String("budget", "", "budget file (.yaml or .toml): exit 1 when a limit fails")
	relayHops := fs.String("relay-hops", "", "with --model: also run the route with these hops (0,1,... or all) through a relay the harness runs, as a target 'route+relay' on the same workers, interleaved with the direct route")
	relayLatency := fs.Duration("relay-latency", 0, "with --relay-hops: delay the relay adds to every chunk, each way")
	var links listFlag
	fs.Var(&links, "link", "network condition of a hop, HOP=latency:5ms,jitter:1ms,bandwidth:1gbit (repeatable)")
	jsonOut := fs.String("json", "", "write the report as JSON (schema "+load.Schema+")")
	htmlOut := fs.String("html", "", "write the report as one self-contained HTML page with plots")
	stepTimeout := fs.Duration("step-timeout", 60*time.Second, "deadline of one step on one worker")
	compact := fs.String("compact-logits", "off", "on: ask the last hop for the best K logits only where sampling needs no more (greedy: K=1; --top-k k: K=k) instead of the whole vocabulary's, the same tokens; both: also a target 'route+compact' on the route's workers and --link proxies, in interleaved rounds with 'route'")
	quiet := fs.Bool("quiet", false, "no live progress line")
	workDir := fs.String("work-dir", "", "where worker logs and spans go (default: a temporary folder, removed afterwards)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if !slices.Contains([]string{"off", "on", "both"}, *compact) {
		return fmt.Errorf("--compact-logits %q: want off, on or both", *compact)
	}

	// Everything the run needs is checked before a worker starts.
	w := load.Workload{Concurrency: *concurrency, Rate: *rate, Requests: *requests, Duration: *duration, Seed: *seed,
		Sampling: route.Sampling{Temperature: *temperature, TopK: *topK, TopP: *topP, Seed: *seed}}
	if w.Requests == 0 && w.Duration == 0 {
		w.Requests = 40
	}
	var err error
	if *promptFile != "" {
		if *lengthFile != "" {
			return fmt.Errorf("give --prompts or --lengths, not both")
		}
		if *tokenizer == "" {
			*tokenizer = *model
		}
		if w.Prompts, err = tokenizePromptFile(*promptFile, *tokenizer); err != nil {
			return err
		}
		if w.Lengths.Output, err = load.ParseRange(*outputLen); err != nil {
			return err
		}
	} else if *lengthFile != "" {
		if w.Lengths.Pairs, err = load.ReadLengthFile(*lengthFile); err != nil {
			return err
		}
	} else {
		if w.Lengths.Prompt, err = load.ParseRange(*promptLen); err != nil {
			return err
		}
		if w.Lengths.Output, err = load.ParseRange(*outputLen); err != nil {
			return err
		}
	}
	if w.SLO, err = load.ParseSLO(*sloFlag); err != nil {
		return err
	}
	var budget load.Budget
	if *budgetFile != "" {
		if budget, err = load.ReadBudget(*budgetFile); err != nil {
			return err
		}
	}
	sweepParam, levels, err := parseSweep(*sweep, w)
	if err != nil {
		return err
	}
	if *rounds < 1 {
		return fmt.Errorf("--rounds must be at least 1")
	}
	if (*routeFlag == "") == (*model == "") {
		fs.Usage()
		return fmt.Errorf("give --route or --model, not both")
	}
	if *routeFlag != "" && (*unsplit || *cut.shards > 0 || *cut.rangesFlag != "" || *cut.by != "layers" || *cut.kvCells != 0 || *stages || *relayHops != "") {
		return fmt.Errorf("--unsplit, --shards, --ranges, --by, --kv-cells, --stages and --relay-hops need --model (the harness starts those workers); a route you run takes relay://HOST:PORT/NAME hops in --route")
	}
	if *relayLatency < 0 {
		return fmt.Errorf("--relay-latency must not be negative")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir := *workDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "shardd-bench-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}

	rep := &load.Report{Schema: load.Schema, Started: time.Now(), Command: "shardd bench " + strings.Join(args, " ")}
	var targets []load.Target
	if *routeFlag != "" {
		addrs := splitList(*routeFlag)
		t := load.Target{Name: "route", Addrs: addrs, Workers: addrs}
		if *spanFiles != "" {
			t.SpanFiles, t.SpanFlush = splitList(*spanFiles), 6*time.Second
		}
		targets = append(targets, t)
		rep.Targets = append(rep.Targets, load.TargetInfo{Name: t.Name, Workers: addrs})
	} else {
		var rl *relayTarget
		if *relayHops != "" {
			if rl, err = startRelay(*relayHops, *relayLatency); err != nil {
				return err
			}
			defer rl.relay.Close()
		}
		spawned, infos, closeAll, err := startTargets(ctx, *model, cut, *threads, *workerCPUs, *unsplit,
			*unsplitThreads, *unsplitCPUs, *serveArgs, *stages, dir, w, levels, sweepParam, rl)
		defer closeAll()
		if err != nil {
			return err
		}
		targets, rep.Targets = spawned, infos
	}
	hopLinks, err := load.ParseLinks(links, len(targets[0].Addrs))
	if err != nil {
		return err
	}
	addrs, proxies, err := load.StartLinks(targets[0].Addrs, hopLinks)
	if err != nil {
		return err
	}
	defer proxies.Close()
	targets[0].Addrs = addrs
	rep.Targets[0].Links = links
	if *compact == "both" {
		// The same workers through the same links, asking for compact output.
		ct, ci := targets[0], rep.Targets[0]
		ct.Name, ci.Name, ct.CompactLogits = "route+compact", "route+compact", true
		ct.Addrs = slices.Clone(ct.Addrs)
		targets = slices.Insert(targets, 1, ct)
		rep.Targets = slices.Insert(rep.Targets, 1, ci)
	}

	rep.Workload = workloadInfo(w, levels, sweepParam, *rounds, *warmup)
	opts := load.RunOptions{Route: route.Options{StepTimeout: *stepTimeout, CompactLogits: *compact == "on"}}
	if *routeFlag != "" {
		if opts.Route.TLS, err = tlsf.config(splitList(*routeFlag), nil); err != nil {
			return err
		}
	} else if *tlsf.ca != "" || *tlsf.cert != "" {
		return fmt.Errorf("the TLS flags are for --route: the workers --model starts listen on loopback in plaintext")
	}
	if !*quiet {
		opts.Progress = os.Stderr
	}
	for round := 1; round <= *rounds; round++ {
		for _, lvl := range levels {
			lw := w
			if sweepParam == "rate" {
				lw.Rate = lvl
			} else if w.Rate == 0 {
				lw.Concurrency = int(lvl)
			}
			lw.Warmup = *warmup
			if lw.Warmup < 0 {
				lw.Warmup = max(lw.Concurrency, 1)
			}
			for _, t := range targets {
				opts.Label = runLabel(t.Name, lw, round, *rounds)
				s, err := load.Run(ctx, t, lw, opts)
				if err != nil {
					return err
				}
				s.Round = round
				rep.Runs = append(rep.Runs, s)
			}
		}
	}
	rep.Finish(budget, sweepParam)
	fmt.Println()
	rep.WriteText(os.Stdout)
	if *jsonOut != "" {
		if err := rep.WriteJSON(*jsonOut); err != nil {
			return err
		}
		fmt.Printf("wrote %s\n", *jsonOut)
	}
	if *htmlOut != "" {
		if err := rep.WriteHTML(*htmlOut); err != nil {
			return err
		}
		fmt.Printf("wrote %s\n", *htmlOut)
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
		Temperature: w.Sampling.Temperature, TopK: w.Sampling.TopK, TopP: w.Sampling.TopP, Seed: w.Seed, Rounds: rounds, SLO: w.SLO.String()}
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

// startTargets splits the model, starts the route's workers (and the
// unsplit baseline's) and returns the targets; closeAll stops every
// process it started, also after an error.
func startTargets(ctx context.Context, model string, cut cutFlags, threadsFlag, cpusFlag string, unsplit bool,
	unsplitThreads, unsplitCPUs, serveArgs string, stages bool, dir string, w load.Workload, levels []float64, sweepParam string,
	rl *relayTarget,
) (targets []load.Target, infos []load.TargetInfo, closeAll func(), err error) {
	var clusters []*load.Cluster
	closeAll = func() {
		for _, c := range clusters {
			c.Close()
		}
	}
	meta, err := gguf.Read(model)
	if err != nil {
		return nil, nil, closeAll, err
	}
	rs, err := cut.ranges(model)
	if err != nil {
		return nil, nil, closeAll, err
	}
	threads, err := perWorkerInts(threadsFlag, len(rs))
	if err != nil {
		return nil, nil, closeAll, err
	}
	cpuSets, err := load.ParseCPUSets(cpusFlag)
	if err != nil {
		return nil, nil, closeAll, err
	}
	if len(cpuSets) > 0 && len(cpuSets) != len(rs) {
		return nil, nil, closeAll, fmt.Errorf("--worker-cpus has %d sets for %d workers", len(cpuSets), len(rs))
	}
	var baseThreads []int
	for _, v := range splitList(unsplitThreads) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return nil, nil, closeAll, fmt.Errorf("--unsplit-threads: bad value %q", v)
		}
		baseThreads = append(baseThreads, n)
	}
	baseCPUs, err := load.ParseCPUSets(unsplitCPUs)
	if err != nil {
		return nil, nil, closeAll, err
	}
	if len(baseCPUs) > 0 && len(baseCPUs) != len(baseThreads) {
		return nil, nil, closeAll, fmt.Errorf("--unsplit-cpus has %d sets for %d baselines", len(baseCPUs), len(baseThreads))
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	paths, err := load.Shards(model, rs, filepath.Join(cache, "shardd", "bench-shards"))
	if err != nil {
		return nil, nil, closeAll, err
	}
	extra := append(sessionArgs(w, levels, sweepParam), strings.Fields(serveArgs)...)
	relayed := map[int]string{} // hop -> its relay URL
	if rl != nil {
		if relayed, err = rl.hops(len(rs)); err != nil {
			return nil, nil, closeAll, err
		}
	}

	route := load.Target{Name: "route"}
	info := load.TargetInfo{Name: "route", Threads: threads}
	var specs []load.WorkerSpec
	for i, p := range paths {
		s := load.WorkerSpec{Model: p, Name: fmt.Sprintf("hop%d", i), Threads: threads[i], Args: extra}
		if u, ok := relayed[i]; ok {
			s.Args = append(slices.Clone(extra), "--relay", u)
		}
		if len(cpuSets) > 0 {
			s.CPUs = cpuSets[i]
			info.CPUs = append(info.CPUs, intsString(s.CPUs))
		}
		if stages {
			s.SpanFile = filepath.Join(dir, s.Name+".spans.jsonl")
			route.SpanFiles = append(route.SpanFiles, s.SpanFile)
			route.Instances = append(route.Instances, s.Name)
		}
		specs = append(specs, s)
		info.Ranges = append(info.Ranges, rs[i].String())
	}
	route.SpanFlush = time.Second
	c, err := load.StartWorkers(ctx, selfPath(), dir, specs)
	if err != nil {
		return nil, nil, closeAll, err
	}
	clusters = append(clusters, c)
	route.Addrs, route.Workers, info.Workers = c.Addrs, c.Addrs, c.Addrs
	targets, infos = append(targets, route), append(infos, info)
	if len(relayed) > 0 {
		// The same workers, with the relayed hops reached through the relay.
		rt, ri := route, info
		rt.Name, ri.Name = "route+relay", "route+relay"
		rt.Addrs = slices.Clone(c.Addrs)
		rt.Workers = rt.Addrs
		for i, u := range relayed {
			rt.Addrs[i] = u
		}
		ri.Workers = rt.Addrs
		targets, infos = append(targets, rt), append(infos, ri)
	}

	for i, th := range baseThreads {
		if !unsplit {
			break
		}
		name := "unsplit"
		if len(baseThreads) > 1 {
			name = fmt.Sprintf("unsplit-%dt", th)
		}
		s := load.WorkerSpec{Model: model, Name: name, Threads: th, Args: extra}
		bi := load.TargetInfo{Name: name, Ranges: []string{fmt.Sprintf("0:%d", meta.BlockCount)}, Threads: []int{th}}
		if len(baseCPUs) > 0 {
			s.CPUs = baseCPUs[i]
			bi.CPUs = []string{intsString(s.CPUs)}
		}
		base := load.Target{Name: name, SpanFlush: time.Second}
		if stages {
			s.SpanFile = filepath.Join(dir, name+".spans.jsonl")
			base.SpanFiles, base.Instances = []string{s.SpanFile}, []string{s.Name}
		}
		c, err := load.StartWorkers(ctx, selfPath(), dir, []load.WorkerSpec{s})
		if err != nil {
			return nil, nil, closeAll, err
		}
		clusters = append(clusters, c)
		base.Addrs, base.Workers, bi.Workers = c.Addrs, c.Addrs, c.Addrs
		targets, infos = append(targets, base), append(infos, bi)
	}
	return targets, infos, closeAll, nil
}

// sessionArgs sizes the workers the harness starts for the load: sessions
// and KV cells for the most requests that can be in flight at once.
func sessionArgs(w load.Workload, levels []float64, sweepParam string) []string {
	inflight := w.Concurrency
	for _, l := range levels {
		if sweepParam == "concurrency" {
			inflight = max(inflight, int(l))
		}
	}
	if w.Rate > 0 || sweepParam == "rate" {
		inflight = 64
	}
	inflight = min(inflight+1, 255)
	longest := w.PromptLens()[1] + w.Lengths.Output[1]
	for _, p := range w.Lengths.Pairs {
		longest = max(longest, p[0]+p[1])
	}
	return []string{"--max-sessions", strconv.Itoa(inflight), "--ctx-tokens", strconv.Itoa(inflight*(longest+8) + 256)}
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
			if text, _, err = renderMessages(tok, msgs, ""); err != nil {
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

func intsString(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// selfPath is this executable, which the harness runs as 'serve'.
func selfPath() string {
	p, err := os.Executable()
	if err != nil {
		return os.Args[0]
	}
	return p
}

// relayTarget is the relay the harness runs for --relay-hops.
type relayTarget struct {
	relay *relay.Relay
	addr  string
	spec  string // the --relay-hops value
}

func startRelay(spec string, latency time.Duration) (*relayTarget, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay.Relay{Latency: latency}
	go r.Serve(ln)
	return &relayTarget{relay: r, addr: ln.Addr().String(), spec: spec}, nil
}

// hops parses the --relay-hops list for a route of n hops into each
// relayed hop's URL.
func (rl *relayTarget) hops(n int) (map[int]string, error) {
	out := map[int]string{}
	for _, v := range splitList(rl.spec) {
		if v == "all" {
			for i := range n {
				out[i] = fmt.Sprintf("relay://%s/hop%d", rl.addr, i)
			}
			continue
		}
		i, err := strconv.Atoi(v)
		if err != nil || i < 0 || i >= n {
			return nil, fmt.Errorf("--relay-hops: %q is not a hop of this %d-hop route", v, n)
		}
		out[i] = fmt.Sprintf("relay://%s/hop%d", rl.addr, i)
	}
	return out, nil
}
