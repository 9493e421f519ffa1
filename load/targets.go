package load

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/relay"
)

// Spawn says which targets the harness starts from a model: a route of one
// worker per range, and the unsplit baselines.
type Spawn struct {
	// Bin is the shardd executable, run as `shardd serve`.
	Bin string
	// Model is the whole-model GGUF; Shards are its parts, one per Ranges.
	Model  string
	Shards []string
	Ranges []gguf.Range
	// Threads per worker; CPUs per worker (nil: no pinning).
	Threads []int
	CPUs    [][]int
	// Baselines: one unsplit worker each (none: no baseline).
	Baselines []Baseline
	// ServeArgs are further flags for every worker.
	ServeArgs []string
	// Stages: workers write spans into Dir, for per-stage latency.
	Stages bool
	// Dir holds the workers' logs and spans.
	Dir string
	// Relayed maps a hop to the relay URL its worker also registers at;
	// a target "route+relay" then reaches those hops through the relay.
	Relayed map[int]string
	// Standbys per hop: that many more workers of each shard, the route's
	// alternates (route.Options.Alternates).
	Standbys int
	// Kill, when set, kills a worker of the route during each of its runs.
	Kill *KillPlan
}

// KillPlan kills hop Hop's worker (SIGKILL) At into a run's measured
// phase and starts it again on its address Restart later, or, with
// Restart 0, when the run ends (the next run dials it).
type KillPlan struct {
	Hop         int
	At, Restart time.Duration
}

// Baseline is one unsplit worker.
type Baseline struct {
	Threads int
	CPUs    []int // nil: not pinned
}

// Spawned is the started targets. Close stops every worker.
type Spawned struct {
	Targets  []Target
	Infos    []TargetInfo
	clusters []*Cluster
}

// Close stops every process started.
func (s *Spawned) Close() {
	for _, c := range s.clusters {
		c.Close()
	}
}

// StartTargets starts the route's workers, the relayed view of them, and
// the baselines. On error, what was started is stopped.
func StartTargets(ctx context.Context, sp Spawn) (*Spawned, error) {
	out := &Spawned{}
	if err := out.startRoute(ctx, sp); err != nil {
		out.Close()
		return nil, err
	}
	for _, b := range sp.Baselines {
		if err := out.startBaseline(ctx, sp, b); err != nil {
			out.Close()
			return nil, err
		}
	}
	return out, nil
}

func (s *Spawned) startRoute(ctx context.Context, sp Spawn) error {
	if len(sp.Threads) != len(sp.Shards) || len(sp.Ranges) != len(sp.Shards) || (len(sp.CPUs) > 0 && len(sp.CPUs) != len(sp.Shards)) {
		return fmt.Errorf("load: %d shards, %d ranges, %d thread counts, %d CPU sets", len(sp.Shards), len(sp.Ranges), len(sp.Threads), len(sp.CPUs))
	}
	t := Target{Name: "route", SpanFlush: time.Second}
	info := TargetInfo{Name: "route", Threads: sp.Threads}
	var specs []WorkerSpec
	for i, p := range sp.Shards {
		// Each worker's metrics on a port of its own, for the prefix cache's
		// hit rate (sampleCounters).
		args := append(slices.Clone(sp.ServeArgs), "--metrics-listen", "127.0.0.1:0")
		w := WorkerSpec{Model: p, Name: fmt.Sprintf("hop%d", i), Threads: sp.Threads[i], Args: args}
		if u, ok := sp.Relayed[i]; ok {
			w.Args = append(args, "--relay", u)
		}
		if len(sp.CPUs) > 0 {
			w.CPUs = sp.CPUs[i]
			info.CPUs = append(info.CPUs, IntsString(w.CPUs))
			for _, cpu := range w.CPUs {
				if !slices.Contains(t.CPUs, cpu) {
					t.CPUs = append(t.CPUs, cpu)
				}
			}
		}
		if sp.Stages {
			w.SpanFile = filepath.Join(sp.Dir, w.Name+".spans.jsonl")
			t.SpanFiles, t.Instances = append(t.SpanFiles, w.SpanFile), append(t.Instances, w.Name)
		}
		specs = append(specs, w)
		info.Ranges = append(info.Ranges, sp.Ranges[i].String())
	}
	n := len(specs)
	for k := range sp.Standbys {
		for i := range n {
			w := specs[i]
			w.Name, w.SpanFile = fmt.Sprintf("hop%d-standby%d", i, k+1), ""
			specs = append(specs, w)
		}
	}
	c, err := StartWorkers(ctx, sp.Bin, sp.Dir, specs)
	if err != nil {
		return err
	}
	s.clusters = append(s.clusters, c)
	t.Addrs, t.Workers, info.Workers, t.Metrics = c.Addrs[:n], c.Addrs[:n], c.Addrs[:n], c.Metrics[:n]
	if sp.Standbys > 0 {
		t.Alternates = make([][]string, n)
		for k := range sp.Standbys {
			for i := range n {
				t.Alternates[i] = append(t.Alternates[i], c.Addrs[n*(k+1)+i])
			}
		}
		info.Standbys = t.Alternates
	}
	if sp.Kill != nil {
		if sp.Kill.Hop < 0 || sp.Kill.Hop >= n {
			return fmt.Errorf("load: --kill: the route has no hop %d", sp.Kill.Hop)
		}
		t.Kill, t.cluster = sp.Kill, c
	}
	s.add(t, info)
	if len(sp.Relayed) > 0 {
		// The same workers, with the relayed hops reached through the relay.
		t.Name, info.Name, t.Kill = "route+relay", "route+relay", nil
		t.Addrs = slices.Clone(c.Addrs)
		for i, u := range sp.Relayed {
			t.Addrs[i] = u
		}
		t.Workers, info.Workers = t.Addrs, t.Addrs
		s.add(t, info)
	}
	return nil
}

func (s *Spawned) startBaseline(ctx context.Context, sp Spawn, b Baseline) error {
	meta, err := gguf.Read(sp.Model)
	if err != nil {
		return err
	}
	name := "unsplit"
	if len(sp.Baselines) > 1 {
		name = fmt.Sprintf("unsplit-%dt", b.Threads)
	}
	// Its metrics on a port of its own, as the route's workers'.
	args := append(slices.Clone(sp.ServeArgs), "--metrics-listen", "127.0.0.1:0")
	w := WorkerSpec{Model: sp.Model, Name: name, Threads: b.Threads, Args: args, CPUs: b.CPUs}
	info := TargetInfo{Name: name, Ranges: []string{fmt.Sprintf("0:%d", meta.BlockCount)}, Threads: []int{b.Threads}}
	if len(b.CPUs) > 0 {
		info.CPUs = []string{IntsString(b.CPUs)}
	}
	t := Target{Name: name, SpanFlush: time.Second, CPUs: b.CPUs}
	if sp.Stages {
		w.SpanFile = filepath.Join(sp.Dir, name+".spans.jsonl")
		t.SpanFiles, t.Instances = []string{w.SpanFile}, []string{w.Name}
	}
	c, err := StartWorkers(ctx, sp.Bin, sp.Dir, []WorkerSpec{w})
	if err != nil {
		return err
	}
	s.clusters = append(s.clusters, c)
	t.Addrs, t.Workers, info.Workers, t.Metrics = c.Addrs, c.Addrs, c.Addrs, c.Metrics
	s.add(t, info)
	return nil
}

func (s *Spawned) add(t Target, info TargetInfo) {
	s.Targets, s.Infos = append(s.Targets, t), append(s.Infos, info)
}

// SessionArgs sizes the workers the harness starts for a load: sessions and
// KV cells for the most requests that can be in flight at once, at any of
// the levels, in either mode (--serve-args after them can change both).
func SessionArgs(w Workload, levels []float64, sweepParam string) []string {
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
	longest := w.PromptLens()[1] + w.LongestOutput()
	// One session's worth more than in flight: a --exact worker
	// holds each session to --ctx-tokens/(--max-sessions+1).
	return []string{"--max-sessions", strconv.Itoa(inflight), "--ctx-tokens", strconv.Itoa((inflight+1)*(longest+8) + 256)}
}

// IntsString writes a CPU set as 0,1,2.
func IntsString(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// Relay is a relay the harness runs in its own process on loopback, for
// relayed hops.
type Relay struct {
	*relay.Relay
	addr string
}

// StartRelay serves a relay on loopback that adds latency to every chunk,
// each way.
func StartRelay(latency time.Duration) (*Relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay.Relay{Latency: latency}
	go r.Serve(ln)
	return &Relay{Relay: r, addr: ln.Addr().String()}, nil
}

// Hops reads a hop list (0,2 or all) for a route of n hops into each
// relayed hop's URL at this relay.
func (r *Relay) Hops(spec string, n int) (map[int]string, error) {
	out := map[int]string{}
	for _, v := range strings.Split(spec, ",") {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		if v == "all" {
			for i := range n {
				out[i] = fmt.Sprintf("relay://%s/hop%d", r.addr, i)
			}
			continue
		}
		i, err := strconv.Atoi(v)
		if err != nil || i < 0 || i >= n {
			return nil, fmt.Errorf("--relay-hops: %q is not a hop of this %d-hop route", v, n)
		}
		out[i] = fmt.Sprintf("relay://%s/hop%d", r.addr, i)
	}
	return out, nil
}
