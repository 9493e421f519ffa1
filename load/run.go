package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshnet/shardd/internal/hoststat"
	"github.com/meshnet/shardd/route"
	"github.com/meshnet/shardd/telemetry"
)

// Target is what a run loads: a route of workers.
type Target struct {
	// Name labels the target in reports: "route", "unsplit", or the
	// operator's choice.
	Name string
	// Addrs are the addresses the head dials, in layer order (a link's
	// proxy where one is set).
	Addrs []string
	// Workers are the workers' own addresses, for the report.
	Workers []string
	// Instances are the names the workers give their spans (serve
	// --instance), in route order; default Workers.
	Instances []string
	// SpanFiles are span files the workers write (serve --traces
	// file:PATH); when set, the run reports per-stage latency from the
	// spans of its measured window.
	SpanFiles []string
	// SpanFlush is how long the workers may take to write a span after it
	// ended (their batch span processor's delay).
	SpanFlush time.Duration
	// CompactLogits: the head asks this target's last hop for compact
	// output (route.Options.CompactLogits), whatever RunOptions say.
	CompactLogits bool
	// Metrics are the workers' Prometheus addresses in route order ("":
	// none); when set, the run reports each hop's prefix cache hit rate.
	Metrics []string
	// Alternates are standbys per hop (route.Options.Alternates).
	Alternates [][]string
	// Kill kills one of the route's workers during each run (Spawn.Kill;
	// cluster holds the worker).
	Kill    *KillPlan
	cluster *Cluster
	// OpenAI, when set, is the base URL of an OpenAI-compatible server
	// (shardd api, llama-server, vLLM) the run drives instead of a route
	// (openAIClient); Addrs are then empty, and APIKey its bearer key.
	OpenAI, APIKey string
	// CPUs are the CPUs its workers are pinned to (nil: not pinned); a run
	// samples their speed (Summary.HostCores).
	CPUs []int
}

// generator is what a run drives: a route, or an OpenAI-compatible
// server.
type generator interface {
	Generate(ctx context.Context, req route.Request, emit func(tok int32) error) (route.Stats, error)
}

// RunOptions are a run's settings beyond its workload.
type RunOptions struct {
	Route route.Options
	// Progress, when set, receives a live progress line every second.
	Progress io.Writer
	// Label starts the progress line and names the run in the report.
	Label string
	// MaxInflight caps an open loop's requests in flight; an arrival
	// beyond it is shed and counted as an error ("SHED"). Default 4096.
	MaxInflight int
	// ProbeCPUs, when set, are the CPUs whose memory read speed is probed
	// before and after the measured phase (Summary.HostReadGBps): the
	// workers' CPUs, the same for every run of a comparison.
	ProbeCPUs []int
}

// recorder collects one run's measurements.
type recorder struct {
	mu             sync.Mutex // guards everything below
	on             bool       // the measured phase is running
	start          time.Time
	ttft, itl      hist
	turnTTFT       []hist // per turn of a conversation, with Turns
	tpot, e2e      hist
	failover       hist // per generation that failed over: its longest gap
	failovers      int
	hopExec        []hist
	hopWire        []hist
	hopPrefillExec []hist
	hopOutBytes    []int64
	itlSeries      series
	requests, good int
	tokens         int
	errs           map[string]int
	errSample      map[string]string
	retries, recov int
	busy           int
	busyWait       time.Duration
	dupAcks        int
	lastDone       time.Time
	// cutoff is when the arrivals ended (the duration was up, or the last
	// request was issued); steady counts the measured tokens emitted
	// until then. A request recorded before the cutoff was set ended
	// before it, so all its tokens count; one recorded after counts its
	// tokens up to the cutoff.
	cutoff time.Time
	steady int
	// killAt is when Target.Kill killed its worker (zero: not yet).
	killAt time.Time
	// perTick counts the measured tokens by when they came, in ticks of
	// tickDur since start (the kill's tokens/s dip).
	perTick []int
	// prompts counts the prompt tokens the measured phase has sent.
	prompts atomic.Int64
}

func newRecorder(hops int) *recorder {
	r := &recorder{ttft: newHist(), itl: newHist(), tpot: newHist(), e2e: newHist(), failover: newHist(),
		errs: map[string]int{}, errSample: map[string]string{}, itlSeries: series{cap: 20000, rng: 1}}
	for range hops {
		r.hopExec = append(r.hopExec, newHist())
		r.hopWire = append(r.hopWire, newHist())
		r.hopPrefillExec = append(r.hopPrefillExec, newHist())
	}
	r.hopOutBytes = make([]int64, hops)
	return r
}

// observe takes a route's step sample.
func (r *recorder) observe(s route.StepSample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.on || s.Hop >= len(r.hopExec) {
		return
	}
	if !s.Decode {
		r.hopPrefillExec[s.Hop].record(s.Exec)
		return
	}
	r.hopExec[s.Hop].record(s.Exec)
	r.hopWire[s.Hop].record(max(s.Wall-s.Exec, 0))
}

// reqTrace is one request's token times, kept by its own goroutine.
type reqTrace struct {
	arrival time.Time
	times   []time.Time
	turn    int // the turn of its conversation, from 0
}

// finish records a measured request.
func (r *recorder) finish(tr *reqTrace, st route.Stats, err error, slo SLO) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	r.retries += st.Retries
	r.busy += st.Busy
	r.busyWait += st.BusyWait
	r.recov += st.Recoveries
	r.dupAcks += st.DuplicateAcks
	if err != nil {
		class := errorClass(err)
		r.errs[class]++
		if _, ok := r.errSample[class]; !ok {
			msg := err.Error()
			r.errSample[class] = msg[:min(len(msg), 200)]
		}
		return
	}
	for i, h := range st.Hops {
		if i < len(r.hopOutBytes) {
			r.hopOutBytes[i] += h.OutBytes
		}
	}
	n := len(tr.times)
	r.tokens += n
	if n == 0 {
		return
	}
	for _, t := range tr.times {
		if i := int(t.Sub(r.start) / tickDur); i >= 0 && i < maxTicks {
			if i >= len(r.perTick) {
				r.perTick = append(r.perTick, make([]int, i+1-len(r.perTick))...)
			}
			r.perTick[i]++
		}
		if r.cutoff.IsZero() || !t.After(r.cutoff) {
			r.steady++
		}
	}
	end := tr.times[n-1]
	r.lastDone = end
	ttft := tr.times[0].Sub(tr.arrival)
	r.ttft.record(ttft)
	if tr.turn < len(r.turnTTFT) {
		r.turnTTFT[tr.turn].record(ttft)
	}
	e2e := end.Sub(tr.arrival)
	r.e2e.record(e2e)
	var maxITL, tpot time.Duration
	for i := 1; i < n; i++ {
		d := tr.times[i].Sub(tr.times[i-1])
		maxITL = max(maxITL, d)
		r.itl.record(d)
		r.itlSeries.add([2]float64{tr.times[i].Sub(r.start).Seconds(), float64(d.Microseconds()) / 1e3})
	}
	if n > 1 {
		tpot = end.Sub(tr.times[0]) / time.Duration(n-1)
		r.tpot.record(tpot)
	}
	if len(st.Failovers) > 0 {
		r.failovers++
		r.failover.record(maxITL)
	}
	if slo.met(ttft, maxITL, tpot, e2e) {
		r.good++
	}
}

// errorClass names an error for the report: the worker's ErrorCode where
// it refused, else what kind of failure it was.
func errorClass(err error) string {
	var re *route.RefusedError
	var he *HTTPError
	switch {
	case errors.As(err, &re):
		return re.Code.String()
	case errors.As(err, &he):
		return fmt.Sprintf("HTTP_%d", he.Status)
	case errors.Is(err, context.DeadlineExceeded):
		return "DEADLINE"
	case errors.Is(err, context.Canceled):
		return "CANCELED"
	case errors.Is(err, errShed):
		return "SHED"
	}
	return "TRANSPORT"
}

var errShed = errors.New("load: arrival shed, too many requests in flight")

// Run puts workload w on target t and returns the measured summary.
func Run(ctx context.Context, t Target, w Workload, opts RunOptions) (*Summary, error) {
	if opts.MaxInflight <= 0 {
		opts.MaxInflight = 4096
	}
	rec := newRecorder(len(t.Addrs))
	if w.Turns > 1 {
		for range w.Turns {
			rec.turnTTFT = append(rec.turnTTFT, newHist())
		}
	}
	rt, vocab, closeTarget, err := open(ctx, t, opts, rec)
	if err != nil {
		return nil, err
	}
	defer closeTarget()
	if w.Vocab == 0 {
		w.Vocab = vocab
	}
	if err := w.Check(); err != nil {
		return nil, err
	}

	if w.Warmup > 0 {
		warm := w
		warm.Requests, warm.Duration = w.Warmup, 0
		drive(ctx, rt, warm, opts, nil, 1<<30)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}

	reads, err := probeHost(opts.ProbeCPUs, nil)
	if err != nil {
		return nil, err
	}
	// Started before anything else of the measured phase, so that a CPU
	// it cannot pin leaves nothing running; stopped after the kill's
	// revival, which must happen whatever the sampler says.
	cores, err := sampleCores(t.CPUs)
	if err != nil {
		return nil, err
	}
	steal := stealSince(t.CPUs)
	spanFrom := time.Now()
	cpu0 := processCPU()
	kd := hoststat.Kdamond()
	kd0 := kd.CPU()
	rec.mu.Lock()
	rec.on, rec.start = true, time.Now()
	rec.mu.Unlock()
	stopProgress := progress(opts, rec, w)
	counters := sampleCounters(t.Metrics, rec)
	revive := killLater(ctx, t, rec)
	drive(ctx, rt, w, opts, rec, 0)
	reviveErr := revive()
	hostCores, err := cores()
	if err := errors.Join(reviveErr, err); err != nil {
		return nil, err
	}
	hostSteal := steal()
	stopProgress()
	hops := counters()
	rec.mu.Lock()
	rec.on = false
	rec.mu.Unlock()
	cpu := processCPU() - cpu0
	kdCPU := kd.CPU() - kd0
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if reads, err = probeHost(opts.ProbeCPUs, reads); err != nil {
		return nil, err
	}
	s := rec.summary(t, w, opts.Label)
	if s.OutputTokens > 0 {
		s.HarnessCPUPerTokenMicros = float64(cpu.Microseconds()) / float64(s.OutputTokens)
	}
	s.HostKdamondMillis = float64(kdCPU.Microseconds()) / 1000
	s.HostReadGBps, s.HostCores, s.HostSteal = reads, hostCores, hostSteal
	s.PrefixHitRate, s.PrefixHitSeries, s.PrefixMisfits = hops.hitRate, hops.hitSeries, hops.delta[misfitsMetric]
	s.StreamPlaceholders, s.StreamCopies = hops.delta[placeholdersMetric], hops.delta[copiesMetric]
	s.HopBusy, s.HopRowsPerForward, s.HopCost = hops.busy, hops.rows, hops.cost
	if len(t.SpanFiles) > 0 {
		end := time.Now()
		time.Sleep(t.SpanFlush)
		inst := t.Instances
		if len(inst) == 0 {
			inst = t.Workers
		}
		if s.Stages, s.Idle, s.Crossings, err = fromSpans(t.SpanFiles, inst, spanFrom, end); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// killLater kills the worker t.Kill names when its time into the
// measured phase comes, and starts it again Restart later. The returned
// function waits for both and starts it again now if it is still down
// (a run that ended before the restart).
func killLater(ctx context.Context, t Target, rec *recorder) func() error {
	k := t.Kill
	if k == nil || t.cluster == nil {
		return func() error { return nil }
	}
	killed, restarted := make(chan struct{}), make(chan error, 1)
	kill := time.AfterFunc(k.At, func() {
		t.cluster.Kill(k.Hop)
		rec.mu.Lock()
		rec.killAt = time.Now()
		rec.mu.Unlock()
		close(killed)
		if k.Restart > 0 {
			time.AfterFunc(k.Restart, func() { restarted <- t.cluster.Restart(ctx, k.Hop) })
		}
	})
	return func() error {
		if kill.Stop() {
			return nil // the run ended first
		}
		<-killed
		if k.Restart > 0 {
			return <-restarted
		}
		return t.cluster.Restart(ctx, k.Hop)
	}
}

// open connects target t and runs one token through it, which proves it
// generates before any load, and returns its vocabulary (the width of a
// whole logits row, also on a target that asks for compact output; a
// server's /v1/models meta.n_vocab, else 0) and how to close it.
func open(ctx context.Context, t Target, opts RunOptions, rec *recorder) (generator, int, func(), error) {
	first := route.Request{Prompt: []int32{1}, MaxTokens: 1}
	if t.OpenAI != "" {
		c, err := newOpenAIClient(ctx, t.OpenAI, t.APIKey)
		if err != nil {
			return nil, 0, nil, err
		}
		if _, err := c.Generate(ctx, first, func(int32) error { return nil }); err != nil {
			return nil, 0, nil, fmt.Errorf("load: %s: the first generation failed: %w", t.Name, err)
		}
		return c, c.vocab, c.http.CloseIdleConnections, nil
	}
	for _, a := range t.Addrs {
		c, err := net.DialTimeout("tcp", route.NetAddr(a), 3*time.Second)
		if err != nil {
			return nil, 0, nil, fmt.Errorf("load: %s: worker %s is unreachable: %w", t.Name, a, err)
		}
		c.Close()
	}
	ro := opts.Route
	ro.CompactLogits = ro.CompactLogits || t.CompactLogits
	ro.Alternates = t.Alternates
	ro.Observe = rec.observe
	dialCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	rt, err := route.Dial(dialCtx, t.Addrs, ro)
	cancel()
	if err != nil {
		return nil, 0, nil, err
	}
	first.Logits = func(int, []float32) {}
	st, err := rt.Generate(ctx, first, func(int32) error { return nil })
	if err != nil {
		rt.Close()
		return nil, 0, nil, fmt.Errorf("load: %s: the first generation failed: %w", t.Name, err)
	}
	return rt, st.Vocab, rt.Close, nil
}

// arrivalsOver records that the measured phase issues no more requests.
func (r *recorder) arrivalsOver(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cutoff.IsZero() {
		r.cutoff = at
	}
}

// drive issues w's requests (indices from base) and waits for them all.
// rec nil: a warm-up, nothing is recorded.
func drive(ctx context.Context, rt generator, w Workload, opts RunOptions, rec *recorder, base int) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ph := &phase{ctx: ctx, rt: rt, w: w, rec: rec, base: base, convs: w.Requests}
	// deadline closes when the arrivals are over (a timer's channel
	// would tell only one of the closed loop's goroutines).
	if w.Duration > 0 {
		over := make(chan struct{})
		tm := time.AfterFunc(w.Duration, func() {
			if rec != nil {
				rec.arrivalsOver(time.Now())
			}
			close(over)
		})
		defer tm.Stop()
		ph.deadline = over
	}
	if t := w.turns(); t > 1 && ph.convs > 0 {
		ph.convs = (ph.convs + t - 1) / t
	}
	if w.Rate <= 0 {
		ph.closedLoop()
		return
	}
	ph.openLoop(opts.MaxInflight)
}

// phase is one drive's state: its arrivals, and what each request does.
type phase struct {
	ctx      context.Context
	rt       generator
	w        Workload
	rec      *recorder // nil: the warm-up, recorded nowhere
	base     int       // the first request's index in the workload
	deadline <-chan struct{}
	issued   atomic.Int64
	convs    int // conversations in the phase (0: until the deadline)
	wg       sync.WaitGroup
}

// next hands out the next conversation's index (a request's, with one
// turn each), or false when the phase's arrivals are over.
func (ph *phase) next() (int, bool) {
	select {
	case <-ph.deadline:
		return 0, false
	case <-ph.ctx.Done():
		return 0, false
	default:
	}
	i := int(ph.issued.Add(1)) - 1
	if ph.convs > 0 && i >= ph.convs {
		return 0, false
	}
	if ph.rec != nil && ph.convs > 0 && i == ph.convs-1 {
		ph.rec.arrivalsOver(time.Now())
	}
	return i, true
}

// one runs one request and records it; it returns the tokens generated
// when the workload has turns (the next turn's history).
func (ph *phase) one(req route.Request, arrival time.Time, turn int) []int32 {
	if ph.rec != nil {
		ph.rec.prompts.Add(int64(len(req.Prompt)))
	}
	tr := &reqTrace{arrival: arrival, turn: turn}
	tr.times = make([]time.Time, 0, req.MaxTokens)
	var out []int32
	st, err := ph.rt.Generate(ph.ctx, req, func(tok int32) error {
		tr.times = append(tr.times, time.Now())
		if ph.w.Turns > 1 {
			out = append(out, tok)
		}
		return nil
	})
	if err == nil && len(tr.times) != req.MaxTokens {
		err = fmt.Errorf("load: %d of %d tokens", len(tr.times), req.MaxTokens)
	}
	if ph.rec != nil && ph.ctx.Err() == nil {
		ph.rec.finish(tr, st, err, ph.w.SLO)
	}
	return out
}

// conversation runs conversation c's turns one after another, each
// sending the history so far and its own message; arrival is its first
// turn's.
func (ph *phase) conversation(c int, arrival time.Time) {
	w := ph.w
	first := ph.base + c*w.turns()
	req := w.request(first)
	history := slices.Clone(req.Prompt)
	for t := range w.turns() {
		if t > 0 {
			req = w.message(first + t)
			req.Prompt = slices.Concat(history, req.Prompt)
			history = req.Prompt
			arrival = time.Now()
		}
		out := ph.one(req, arrival, t)
		if ph.ctx.Err() != nil {
			return
		}
		history = slices.Concat(history, out)
	}
}

// closedLoop keeps Concurrency conversations in flight until the arrivals
// are over.
func (ph *phase) closedLoop() {
	for range ph.w.Concurrency {
		ph.wg.Go(func() {
			for {
				i, ok := ph.next()
				if !ok {
					return
				}
				ph.conversation(i, time.Now())
			}
		})
	}
	ph.wg.Wait()
}

// openLoop starts conversations at the workload's arrival times, shedding
// those that find maxInflight in flight.
func (ph *phase) openLoop(maxInflight int) {
	defer ph.wg.Wait()
	gap := ph.w.arrivals()
	var inflight atomic.Int64
	at := time.Now()
	for {
		at = at.Add(gap())
		if d := time.Until(at); d > 0 {
			tm := time.NewTimer(d)
			select {
			case <-tm.C:
			case <-ph.deadline:
				tm.Stop()
				return
			case <-ph.ctx.Done():
				tm.Stop()
				return
			}
		}
		i, ok := ph.next()
		if !ok {
			return
		}
		if inflight.Load() >= int64(maxInflight) {
			if ph.rec != nil {
				ph.rec.finish(&reqTrace{arrival: at}, route.Stats{}, errShed, ph.w.SLO)
			}
			continue
		}
		inflight.Add(1)
		arrival := at
		ph.wg.Go(func() {
			defer inflight.Add(-1)
			ph.conversation(i, arrival)
		})
	}
}

// progress prints a live line until the returned stop is called.
func progress(opts RunOptions, rec *recorder, w Workload) (stop func()) {
	if opts.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(time.Second)
		defer tk.Stop()
		for {
			select {
			case <-done:
				fmt.Fprintln(opts.Progress)
				return
			case <-tk.C:
			}
			rec.mu.Lock()
			el := time.Since(rec.start).Seconds()
			line := fmt.Sprintf("\r%s: %d", opts.Label, rec.requests)
			if w.Requests > 0 {
				line += fmt.Sprintf("/%d", w.Requests)
			}
			errs := 0
			for _, n := range rec.errs {
				errs += n
			}
			line += fmt.Sprintf(" requests, %.1f tokens/s, ttft p99 %.1f ms, itl p99 %.1f ms, %d errors  ",
				float64(rec.tokens)/el, ms(rec.ttft.h.ValueAtQuantile(99)), ms(rec.itl.h.ValueAtQuantile(99)), errs)
			rec.mu.Unlock()
			fmt.Fprint(opts.Progress, line)
		}
	})
	return func() { close(done); wg.Wait() }
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tickDur is the width of the recorder's token counts over time; maxTicks
// bounds them (an hour).
const (
	tickDur  = 100 * time.Millisecond
	maxTicks = 36000
)

// killWindow is how long before and after the kill aroundKill counts.
const killWindow = 3 * time.Second

// aroundKill is the tokens/s of the killWindow before the kill and of the
// killWindow after it (0 where the run had not that much time on a side
// before its arrivals ended).
// Both come from the same run, seconds apart, so the ratio is the dip the
// kill made, not the spread between runs.
func (r *recorder) aroundKill() (before, after float64) {
	k := int(r.killAt.Sub(r.start) / tickDur)
	w := int(killWindow / tickDur)
	rate := func(from, to int) float64 {
		if from < 0 || to > len(r.perTick) {
			return 0
		}
		n := 0
		for _, c := range r.perTick[from:to] {
			n += c
		}
		return float64(n) / killWindow.Seconds()
	}
	before = rate(k-w, k)
	last := r.cutoff
	if last.IsZero() {
		last = r.lastDone
	}
	if int(last.Sub(r.start)/tickDur) >= k+w {
		after = rate(k, k+w)
	}
	return before, after
}

// summary turns the recorder into the run's Summary.
func (r *recorder) summary(t Target, w Workload, label string) *Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &Summary{Label: label, Target: t.Name, Concurrency: w.Concurrency, Rate: w.Rate,
		Requests: r.requests, OutputTokens: r.tokens, ErrorsByCode: map[string]int{},
		Retries: r.retries, Recoveries: r.recov, DuplicateAcks: r.dupAcks, Busy: r.busy, BusyWaitS: r.busyWait.Seconds(),
		TTFT: r.ttft.dist(true), ITL: r.itl.dist(true), TPOT: r.tpot.dist(false), E2E: r.e2e.dist(false),
		Failovers: r.failovers, FailoverTime: r.failover.dist(false)}
	if !r.killAt.IsZero() {
		s.KillAtS = r.killAt.Sub(r.start).Seconds()
		s.TokensPerSBeforeKill, s.TokensPerSAfterKill = r.aroundKill()
	}
	if len(r.errSample) > 0 {
		s.ErrorSamples = maps.Clone(r.errSample)
	}
	for k, v := range r.errs {
		s.ErrorsByCode[k] = v
		s.Errors += v
	}
	if !r.lastDone.IsZero() {
		s.ElapsedSeconds = r.lastDone.Sub(r.start).Seconds()
	}
	if s.ElapsedSeconds > 0 {
		s.OutputTokensPerS = float64(r.tokens) / s.ElapsedSeconds
		s.RequestsPerS = float64(r.requests-s.Errors) / s.ElapsedSeconds
	}
	if window := r.cutoff.Sub(r.start); !r.cutoff.IsZero() && window > 0 {
		s.SteadySeconds = window.Seconds()
		s.SteadyTokensPerS = float64(r.steady) / s.SteadySeconds
	}
	if r.requests > 0 {
		s.Goodput = float64(r.good) / float64(r.requests)
		s.ErrorRate = float64(s.Errors) / float64(r.requests)
	}
	for i := range r.hopExec {
		h := HopSummary{Hop: i, Exec: r.hopExec[i].dist(false), Wire: r.hopWire[i].dist(false),
			PrefillExec: r.hopPrefillExec[i].dist(false)}
		if r.tokens > 0 {
			h.OutBytesPerToken = float64(r.hopOutBytes[i]) / float64(r.tokens)
		}
		if i < len(t.Workers) {
			h.Worker = t.Workers[i]
		}
		if i < len(t.Addrs) {
			h.Addr = t.Addrs[i]
		}
		s.Hops = append(s.Hops, h)
	}
	for _, h := range r.turnTTFT {
		s.TurnTTFT = append(s.TurnTTFT, h.dist(false).P50)
	}
	s.ITLSeries = slices.Clone(r.itlSeries.pts)
	sort.Slice(s.ITLSeries, func(a, b int) bool { return s.ITLSeries[a][0] < s.ITLSeries[b][0] })
	return s
}

// The workers' counters the harness reports per hop (their differences
// over the measured phase).
const (
	prefixTokensMetric = "shardd_prefix_tokens_total"
	misfitsMetric      = "shardd_prefix_misfits_total"
	placeholdersMetric = "shardd_streams_placeholder_rows_total"
	copiesMetric       = "shardd_streams_copies_total"
	busyMetric         = "shardd_forward_busy"
	rowsSumMetric      = "shardd_batch_rows_sum"
	rowsCountMetric    = "shardd_batch_rows_count"
	costBaseMetric     = "shardd_cost_base"
	costRowMetric      = "shardd_cost_per_row"
)

// hopCounters is what sampleCounters read: per hop, the share of the
// prompt tokens sent that its prefix cache answered, overall and by second
// of the run, each counted metric's difference over the run, the share of
// the run its backend spent in forward calls, its rows per forward, and
// its cost model.
type hopCounters struct {
	hitRate   []float64
	hitSeries [][][2]float64
	delta     map[string][]int64
	busy      []float64
	rows      []float64
	cost      [][2]float64 // the hop's cost model at the end: seconds a forward, a row
}

// sampleCounters reads each hop's counters now and its prefix cache's
// every second until the returned function is called, which reports them
// (hopCounters) since that. No metrics: nothing. A worker whose page
// cannot be read counts 0.
func sampleCounters(metrics []string, rec *recorder) func() hopCounters {
	if len(metrics) == 0 || slices.Contains(metrics, "") {
		return func() hopCounters { return hopCounters{} }
	}
	read := func() []map[string]float64 {
		out := make([]map[string]float64, len(metrics))
		for i, m := range metrics {
			out[i], _ = telemetry.Scrape(m, prefixTokensMetric, misfitsMetric, placeholdersMetric, copiesMetric,
				busyMetric, rowsSumMetric, rowsCountMetric, costBaseMetric, costRowMetric)
		}
		return out
	}
	start, base := time.Now(), read()
	series := make([][][2]float64, len(metrics))
	rate := func(now []map[string]float64) []float64 {
		sent := float64(rec.prompts.Load())
		out := make([]float64, len(now))
		for i := range now {
			if sent > 0 {
				out[i] = (now[i][prefixTokensMetric] - base[i][prefixTokensMetric]) / sent
			}
		}
		return out
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				t := time.Since(start).Seconds()
				for i, r := range rate(read()) {
					series[i] = append(series[i], [2]float64{t, r})
				}
			}
		}
	}()
	return func() hopCounters {
		close(stop)
		<-done
		now, wall := read(), time.Since(start).Seconds()
		h := hopCounters{hitRate: rate(now), hitSeries: series, delta: map[string][]int64{}}
		for i := range now {
			d := func(name string) float64 { return now[i][name] - base[i][name] }
			h.busy = append(h.busy, d(busyMetric)/wall)
			rows := 0.0
			if n := d(rowsCountMetric); n > 0 {
				rows = d(rowsSumMetric) / n
			}
			h.rows = append(h.rows, rows)
			h.cost = append(h.cost, [2]float64{now[i][costBaseMetric], now[i][costRowMetric]})
		}
		for _, name := range []string{misfitsMetric, placeholdersMetric, copiesMetric} {
			d := make([]int64, len(now))
			for i := range now {
				d[i] = int64(now[i][name] - base[i][name])
			}
			h.delta[name] = d
		}
		return h
	}
}

// coreEvery is how often a run samples its target's CPUs' speed: the
// host's slow and fast spells last seconds (PERF.md, noise).
const coreEvery = 100 * time.Millisecond

// sampleCores starts sampling cpus' speed and returns what stops it and
// says what it saw (nil where there are no CPUs to sample).
func sampleCores(cpus []int) (func() (*hoststat.Cores, error), error) {
	if len(cpus) == 0 {
		return func() (*hoststat.Cores, error) { return nil, nil }, nil
	}
	s, err := hoststat.SampleCores(cpus, coreEvery)
	if err != nil {
		return nil, err
	}
	return func() (*hoststat.Cores, error) {
		c, err := s.Stop()
		return &c, err
	}, nil
}

// stealSince reads cpus' steal time now and returns a func that says,
// later, which share of the time since each CPU was stolen (nil where there are
// no CPUs, or /proc/stat cannot be read: a host that does not report it).
func stealSince(cpus []int) func() []float64 {
	start := time.Now()
	s0, err := hoststat.Steal(cpus)
	if len(cpus) == 0 || err != nil {
		return func() []float64 { return nil }
	}
	return func() []float64 {
		s1, err := hoststat.Steal(cpus)
		el := time.Since(start)
		if err != nil || el <= 0 {
			return nil
		}
		share := make([]float64, len(cpus))
		for i := range cpus {
			share[i] = float64(s1[i]-s0[i]) / float64(el)
		}
		return share
	}
}

// probeHost appends the memory read speed of cpus to reads (nothing when
// there are none to probe).
func probeHost(cpus []int, reads []float64) ([]float64, error) {
	if len(cpus) == 0 {
		return reads, nil
	}
	gbps, err := hoststat.ReadGBps(cpus)
	return append(reads, gbps), err
}
