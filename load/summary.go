package load

import (
	"fmt"
	"github.com/meshnet/shardd/internal/hoststat"
	"strings"
	"time"

	"github.com/meshnet/shardd/telemetry"
)

// SLO is the per-request service level that goodput counts: a request
// meets it when it finished without error and each set limit holds. Zero
// limits are not checked.
type SLO struct {
	// TTFT bounds the time from a request's arrival to its first token.
	TTFT time.Duration `json:"ttft_ms"`
	// ITL bounds every gap between two of the request's tokens (its
	// largest inter-token latency).
	ITL time.Duration `json:"itl_ms"`
	// TPOT bounds the request's mean time per output token after the
	// first.
	TPOT time.Duration `json:"tpot_ms"`
	// E2E bounds the request's whole latency.
	E2E time.Duration `json:"e2e_ms"`
}

// ParseSLO reads "ttft=300ms,itl=25ms" (keys ttft, itl, tpot, e2e).
func ParseSLO(s string) (SLO, error) {
	var slo SLO
	if strings.TrimSpace(s) == "" {
		return slo, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if !ok || err != nil || d <= 0 {
			return slo, fmt.Errorf("%w: SLO item %q: want NAME=DURATION, e.g. itl=25ms", ErrInput, kv)
		}
		switch strings.TrimSpace(k) {
		case "ttft":
			slo.TTFT = d
		case "itl":
			slo.ITL = d
		case "tpot":
			slo.TPOT = d
		case "e2e":
			slo.E2E = d
		default:
			return slo, fmt.Errorf("%w: SLO names ttft, itl, tpot or e2e, not %q", ErrInput, k)
		}
	}
	return slo, nil
}

func (s SLO) met(ttft, maxITL, tpot, e2e time.Duration) bool {
	ok := func(v, limit time.Duration) bool { return limit == 0 || v <= limit }
	return ok(ttft, s.TTFT) && ok(maxITL, s.ITL) && ok(tpot, s.TPOT) && ok(e2e, s.E2E)
}

// String is the SLO as ParseSLO reads it.
func (s SLO) String() string {
	var parts []string
	for _, p := range []struct {
		k string
		v time.Duration
	}{{"ttft", s.TTFT}, {"itl", s.ITL}, {"tpot", s.TPOT}, {"e2e", s.E2E}} {
		if p.v > 0 {
			parts = append(parts, p.k+"="+p.v.String())
		}
	}
	return strings.Join(parts, ",")
}

// Summary is one measured run: one target under one load.
type Summary struct {
	Label       string  `json:"label"`
	Target      string  `json:"target"`
	Round       int     `json:"round"`
	Concurrency int     `json:"concurrency,omitempty"`
	Rate        float64 `json:"rate,omitempty"`

	Requests     int            `json:"requests"`
	Errors       int            `json:"errors"`
	ErrorRate    float64        `json:"error_rate"`
	ErrorsByCode map[string]int `json:"errors_by_code"`
	// ErrorSamples holds the first error of each class, as it read
	// (bounded to 200 bytes).
	ErrorSamples  map[string]string `json:"error_samples,omitempty"`
	Retries       int               `json:"retries"`
	Recoveries    int               `json:"recoveries"`
	DuplicateAcks int               `json:"duplicate_acks"`
	// Busy counts the refusals of a full worker (RESOURCE_EXHAUSTED,
	// retryable) the heads rode out, BusyWaitS the seconds they waited.
	Busy      int     `json:"busy_refusals"`
	BusyWaitS float64 `json:"busy_wait_s"`

	ElapsedSeconds   float64 `json:"elapsed_s"`
	OutputTokens     int     `json:"output_tokens"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	// SteadyTokensPerS counts only the tokens emitted while requests were
	// still being issued (SteadySeconds from the start): the drain after
	// the last arrival, whose length depends on where the cut falls among
	// the sessions (in a closed loop they move in cohorts), is left out.
	// Measured requests only, like OutputTokensPerS.
	SteadySeconds    float64 `json:"steady_s,omitempty"`
	SteadyTokensPerS float64 `json:"steady_tokens_per_s,omitempty"`
	RequestsPerS     float64 `json:"requests_per_s"`
	// Goodput is the share of requests that met the SLO (1 with no SLO
	// and no errors).
	Goodput float64 `json:"goodput"`

	TTFT Dist `json:"ttft"`
	// TurnTTFT is the TTFT p50 of each turn of the conversations, in
	// milliseconds (Workload.Turns).
	TurnTTFT []float64 `json:"turn_ttft_p50_ms,omitempty"`
	// PrefixHitRate is, per hop, the share of the prompt tokens sent in
	// the measured phase that the hop's prefix cache answered (from its
	// shardd_prefix_tokens_total); PrefixHitSeries the same share so far,
	// by second of the run. Empty when the workers' metrics are unknown.
	PrefixHitRate   []float64      `json:"prefix_hit_rate,omitempty"`
	PrefixHitSeries [][][2]float64 `json:"prefix_hit_series,omitempty"`
	// PrefixMisfits is, per hop, the prefix cache loads during the run
	// that found no room in the KV cache and ran their rows instead
	// (shardd_prefix_misfits_total).
	PrefixMisfits []int64 `json:"prefix_misfits,omitempty"`
	// StreamPlaceholders and StreamCopies are, per hop, the placeholder
	// rows its decode forwards ran between KV streams and the streams it
	// copied to bring a forward's sessions together, during the run
	// (--exact workers: shardd_streams_placeholder_rows_total,
	// shardd_streams_copies_total).
	StreamPlaceholders []int64 `json:"stream_placeholder_rows,omitempty"`
	StreamCopies       []int64 `json:"stream_copies,omitempty"`
	// HopBusy is, per hop, the share of the measured phase its backend
	// spent in forward calls (shardd_forward_busy): what is left is its
	// bubbles, time it had nothing to run. HopRowsPerForward is its mean
	// rows per forward call (shardd_batch_rows), and HopCost its cost
	// model at the run's end: seconds a forward takes, and a row adds
	// (shardd_cost_base, shardd_cost_per_row).
	HopBusy           []float64    `json:"hop_busy,omitempty"`
	HopRowsPerForward []float64    `json:"hop_rows_per_forward,omitempty"`
	HopCost           [][2]float64 `json:"hop_cost,omitempty"`
	ITL               Dist         `json:"itl"`
	TPOT              Dist         `json:"tpot"`
	E2E               Dist         `json:"e2e"`

	Hops []HopSummary `json:"hops"`
	// KillAtS is when a worker was killed (Target.Kill), seconds into the
	// measured phase (0: none). Failovers counts the generations that
	// moved to a standby; FailoverTime is, for each, its longest gap
	// between two tokens: from the last token before the failover to the
	// first after.
	KillAtS      float64 `json:"kill_at_s,omitempty"`
	Failovers    int     `json:"failovers,omitempty"`
	FailoverTime Dist    `json:"failover_time"`
	// TokensPerSBeforeKill and TokensPerSAfterKill are the tokens/s of the
	// 3 s before the kill and the 3 s after it (0: the run had less time
	// on that side): the dip, measured within the run.
	TokensPerSBeforeKill float64 `json:"tokens_per_s_before_kill,omitempty"`
	TokensPerSAfterKill  float64 `json:"tokens_per_s_after_kill,omitempty"`
	// Stages: per hop (in route order) the worker's per-stage span
	// latencies, from the span files of the measured window.
	Stages []map[string]Dist `json:"stages,omitempty"`
	// Idle: per hop (in route order) its forwards in the measured window
	// and the idle between them, from the same spans.
	Idle []HopIdle `json:"idle,omitempty"`
	// Crossings: per hop (in route order) the decode groups that crossed
	// into it from the hop before it (hop 0: from the last, through the
	// head), from the same spans; empty for one worker.
	Crossings []HopCrossing `json:"crossings,omitempty"`
	// HarnessCPUPerTokenMicros is the harness's own CPU time (user and
	// system) per generated token.
	HarnessCPUPerTokenMicros float64 `json:"harness_cpu_per_token_us"`
	// HostKdamondMillis is the CPU time the host's kdamond (DAMON's memory
	// monitor; see internal/hoststat) used during the measured phase, on
	// a Linux host that runs it. A forward stalls while it runs, so a
	// latency tail that grows with it is the host's, not the route's.
	HostKdamondMillis float64 `json:"host_kdamond_ms,omitempty"`
	// HostReadGBps is how fast one thread on each of RunOptions.ProbeCPUs
	// read memory just before and just after the measured phase
	// (hoststat.ReadGBps; absent where none were given). These hosts' read
	// speed has moved by up to 2x within minutes (AMD), and a forward's
	// time with it; on the Intel host it stays flat while a forward's time
	// moves with the core's speed (HostCores).
	HostReadGBps []float64 `json:"host_read_gbps,omitempty"`
	// HostCores is how fast the target's pinned CPUs ran during the
	// measured phase, sampled every 100 ms (hoststat.SampleCores; absent
	// where the target is not pinned). Its Slowest is the pace the CPUs
	// together allowed a pipeline across them, second by second.
	HostCores *hoststat.Cores `json:"host_cores,omitempty"`
	// HostSteal is, for each of the target's pinned CPUs (in
	// HostCores.CPUs' order), the share of the measured phase it waited
	// for the host while it had work (hoststat.Steal): on a VM a halted
	// vCPU's next wakeup may wait for its host, which a pipeline's hops,
	// idle between forwards, pay many times a second (serve --idle-poll).
	HostSteal []float64 `json:"host_steal,omitempty"`
	// ITLSeries is [seconds since the measured phase began, ITL ms]
	// points (a sample of at most 20,000).
	ITLSeries [][2]float64 `json:"itl_series"`
}

// HopSummary is one hop's decode steps as the head saw them.
type HopSummary struct {
	Hop    int    `json:"hop"`
	Worker string `json:"worker"`
	Addr   string `json:"addr"`
	// Exec is the worker's own execution of a decode step (the Ack's
	// execution_nanos); Wire is the head's wait beyond it: network,
	// framing, queueing and the worker's stages before the forward.
	Exec Dist `json:"exec"`
	Wire Dist `json:"wire"`
	// PrefillExec is the worker's execution of a prefill chunk.
	PrefillExec Dist `json:"prefill_exec"`
	// OutBytesPerToken is the tensor payload the hop returned over the
	// measured requests (prefill and decode), per generated token: a last
	// hop's logits, or its compact output.
	OutBytesPerToken float64 `json:"out_bytes_per_token"`
}

// HopIdle is one worker's forwards in the measured window, from its
// spans (telemetry.ForwardIdle): the share of the window spent in them,
// and the idle before them by the kind of forward that ended it.
type HopIdle struct {
	Busy     float64 `json:"busy"`
	Forwards int     `json:"forwards"`
	// GroupRows is a whole decode group's rows (the 90th percentile of
	// the decode-only forwards).
	GroupRows int `json:"group_rows"`
	// Before is keyed by telemetry.BeforeKinds.
	Before map[string]IdleGap `json:"before"`
}

// HopCrossing is the decode groups that crossed into a hop from the hop
// before it in the measured window (telemetry.Crossing), each group's
// hand-off in parts: the sender's frame-out, the relay (the head, the wire)
// to the group's last arrival, the wait for the hop's forward, in all.
type HopCrossing struct {
	Groups int  `json:"groups"`
	Out    Dist `json:"out"`
	Relay  Dist `json:"relay"`
	Wait   Dist `json:"wait"`
	Total  Dist `json:"total"`
}

// IdleGap is the idle before the forwards of one kind: its share of the
// window, the mean gap and the forwards.
type IdleGap struct {
	Share    float64 `json:"share"`
	MeanMs   float64 `json:"mean_ms"`
	Forwards int     `json:"forwards"`
}

// fromSpans reads the workers' span files and summarises each hop's
// stages, forwards and the crossings into it within [from, to]. instances
// name the workers in route order as their spans do.
func fromSpans(files, instances []string, from, to time.Time) ([]map[string]Dist, []HopIdle, []HopCrossing, error) {
	spans, err := telemetry.ReadSpans(files...)
	if err != nil {
		return nil, nil, nil, err
	}
	byInst := telemetry.StageDurations(spans, from, to)
	idle := telemetry.ForwardIdle(spans, from, to)
	stages, idles := make([]map[string]Dist, len(instances)), make([]HopIdle, len(instances))
	var crossings []HopCrossing
	if n := len(instances); n > 1 {
		cs := telemetry.Crossings(spans, from, to)
		crossings = make([]HopCrossing, n)
		for i, inst := range instances {
			if c := cs[[2]string{instances[(i+n-1)%n], inst}]; c != nil {
				crossings[i] = hopCrossing(c)
			}
		}
	}
	for i, inst := range instances {
		stages[i] = map[string]Dist{}
		for stage, ds := range byInst[inst] {
			name := stage
			if stage == "shardd.step" {
				name = "step"
			}
			stages[i][name] = distOf(ds)
		}
		idles[i] = hopIdle(idle[inst])
	}
	return stages, idles, crossings, nil
}

// hopCrossing summarises a telemetry.Crossing's parts.
func hopCrossing(c *telemetry.Crossing) HopCrossing {
	return HopCrossing{Groups: c.Groups(), Out: distOf(c.Out), Relay: distOf(c.Relay), Wait: distOf(c.Wait), Total: distOf(c.Total)}
}

// distOf is the distribution of ds.
func distOf(ds []time.Duration) Dist {
	h := newHist()
	for _, d := range ds {
		h.record(d)
	}
	return h.dist(false)
}

// hopIdle turns a worker's telemetry.Idle into shares of its span.
func hopIdle(id telemetry.Idle) HopIdle {
	h := HopIdle{Busy: id.BusyShare(), Forwards: id.Forwards, GroupRows: id.Group, Before: map[string]IdleGap{}}
	for kind, g := range id.Before {
		h.Before[kind] = IdleGap{Share: id.IdleShare(kind), MeanMs: float64(g.Mean()) / float64(time.Millisecond), Forwards: g.Forwards}
	}
	return h
}
