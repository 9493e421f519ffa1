package main

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshnet/shardd/backend/llamacpp"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/load"
)

// TestParseServe: serve's flags land in the backend's and the engine's
// configuration, derived settings follow them, and values flags cannot
// check are refused, all without opening a model or a port.
func TestParseServe(t *testing.T) {
	c, err := parseServe([]string{"--model", "m.gguf", "--max-sessions", "7", "--boundary", "f32", "--exact",
		"--max-inflight", "3", "--decode-budget", "40ms", "--relay", "127.0.0.1:9/w1", "--pin-threads", "on", "--threads", "2"})
	if err != nil {
		t.Fatal(err)
	}
	e, b := c.engine, c.backend
	if e.MaxSessions != 7 || b.MaxSeqs != 8 || e.Boundary != shardv1.DType_DTYPE_FLOAT32 || !e.Exact || !b.SeparateKV ||
		e.MaxInflightChunks != 3 || e.DecodeBudget != 40*time.Millisecond || b.Path != "m.gguf" || !b.PinThreads || b.Threads != 2 {
		t.Fatalf("engine %+v\nbackend %+v", e, b)
	}
	if old, err := parseServe([]string{"--model", "m.gguf", "--deterministic"}); err != nil || !old.engine.Exact || !old.backend.SeparateKV {
		t.Fatalf("--deterministic, the exact mode's earlier name: %+v %v", old, err)
	}
	if c.relayAddr != "127.0.0.1:9" || c.relayName != "w1" {
		t.Fatalf("relay %q %q", c.relayAddr, c.relayName)
	}
	g, err := parseServe([]string{"--model", "m.gguf", "--gpu-layers", "all", "--device", "CUDA1", "--gpu-fallback", "cpu"})
	if err != nil || g.backend.GPULayers != llamacpp.AllLayers || g.backend.Device != "CUDA1" || !g.gpuFallback {
		t.Fatalf("gpu flags: %+v %v", g, err)
	}
	if g, err = parseServe([]string{"--model", "m.gguf", "--gpu-layers", "5"}); err != nil || g.backend.GPULayers != 5 || g.gpuFallback {
		t.Fatalf("--gpu-layers 5: %+v %v", g, err)
	}
	d, err := parseServe([]string{"--model", "m.gguf"})
	if err != nil {
		t.Fatal(err)
	}
	if d.engine.MaxSessions != 16 || d.engine.MaxPrefillChunkTokens != 512 || d.engine.Boundary != shardv1.DType_DTYPE_BFLOAT16 ||
		!d.engine.RequireChecksum || d.drainTimeout != 30*time.Second || d.relayAddr != "" || d.backend.GPULayers != 0 {
		t.Fatalf("defaults: %+v", d.engine)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--model"},
		{[]string{"--model", "m", "--boundary", "f16"}, "--boundary"},
		{[]string{"--model", "m", "--max-sessions", "0"}, "--max-sessions"},
		{[]string{"--model", "m", "--max-sessions", "256"}, "--max-sessions"},
		{[]string{"--model", "m", "--results-cache-bytes", "0"}, "--results-cache-bytes"},
		{[]string{"--model", "m", "--pin-threads", "maybe"}, "--pin-threads"},
		{[]string{"--model", "m", "--relay", "nowhere"}, "--relay"},
		{[]string{"--model", "m", "--log-level", "loud"}, "--log-level"},
		{[]string{"--model", "m", "--max-inflight", "-1"}, "max-inflight"},
		{[]string{"--model", "m", "--gpu-layers", "most"}, "--gpu-layers"},
		{[]string{"--model", "m", "--gpu-layers", "-2"}, "--gpu-layers"},
		{[]string{"--model", "m", "--gpu-layers", "all", "--gpu-fallback", "maybe"}, "--gpu-fallback"},
		{[]string{"--model", "m", "--device", "CUDA0"}, "--device"},
		{[]string{"--model", "m", "--gpu-layers", "all", "--exact"}, "--exact"},
		{[]string{"--model", "m", "--idle-poll", "-1ms"}, "--idle-poll"},
		// More CPUs than forward threads: the poller would burn CPUs no
		// forward runs on.
		{[]string{"--model", "m", "--idle-poll", "20ms", "--threads", strconv.Itoa(runtime.NumCPU() + 1)}, "--idle-poll"},
	} {
		if _, err := parseServe(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want one naming %s", tc.args, err, tc.want)
		}
	}
	if p, err := parseServe([]string{"--model", "m", "--idle-poll", "20ms", "--threads", strconv.Itoa(runtime.NumCPU())}); err != nil ||
		p.idlePoll != 20*time.Millisecond {
		t.Errorf("--idle-poll 20ms with a thread a CPU: %v", err)
	}
}

// TestParseBench: bench's flags make the workload, the levels and the
// target checks, and contradictions are refused before anything starts.
func TestParseBench(t *testing.T) {
	c, err := parseBench([]string{"--model", "m.gguf", "--shards", "2", "--prompt-len", "16-32", "--output-len", "8",
		"--sweep", "concurrency=1,4,16", "--rounds", "3", "--seed", "7", "--requests", "10"})
	if err != nil {
		t.Fatal(err)
	}
	if c.sweepParam != "concurrency" || len(c.levels) != 3 || c.levels[2] != 16 || c.w.Requests != 10 || c.w.Seed != 7 ||
		c.w.Lengths.Prompt != [2]int{16, 32} || c.w.Lengths.Output != [2]int{8, 8} || c.f.rounds != 3 {
		t.Fatalf("%+v %v %v", c.w, c.levels, c.sweepParam)
	}
	if got := strings.Join(load.SessionArgs(c.w, c.levels, c.sweepParam), " "); got != "--max-sessions 17 --ctx-tokens 1120" {
		t.Fatalf("session args %q", got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--shards", "2"}, "--route or --model"},
		{[]string{"--route", "a:1", "--model", "m"}, "--route or --model"},
		{[]string{"--route", "a:1", "--unsplit"}, "need --model"},
		{[]string{"--model", "m", "--tls-ca", "ca.pem"}, "TLS flags"},
		{[]string{"--model", "m", "--compact-logits", "maybe"}, "--compact-logits"},
		{[]string{"--model", "m", "--rounds", "0"}, "--rounds"},
		{[]string{"--model", "m", "--relay-latency", "-1ms"}, "--relay-latency"},
		{[]string{"--model", "m", "--prompts", "p.jsonl", "--lengths", "l.txt"}, "not both"},
		{[]string{"--model", "m", "--sweep", "rate=0"}, "--sweep"},
		{[]string{"--model", "m", "--prompt-len", "x"}, "x"},
		{[]string{"--model", "m", "extra"}, "unexpected argument"},
		{[]string{"--model", "m", "--ceiling", "--duration", "5s"}, "--ceiling needs --unsplit"},
		{[]string{"--model", "m", "--unsplit", "--ceiling", "--requests", "8"}, "timed closed loop"},
		{[]string{"--model", "m", "--unsplit", "--ceiling", "--duration", "5s", "--rate", "2"}, "timed closed loop"},
	} {
		if _, err := parseBench(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want one naming %s", tc.args, err, tc.want)
		}
	}
}

// --ceiling compares the route with the baseline that has each hop's
// thread count, whichever --unsplit-threads lists first, and refuses
// where there is none or the hops differ.
func TestCeilingBaseline(t *testing.T) {
	c, err := parseBench([]string{"--model", "m", "--shards", "2", "--unsplit", "--unsplit-threads", "2,1", "--ceiling", "--duration", "5s", "--concurrency", "32"})
	if err != nil {
		t.Fatal(err)
	}
	targets := []load.Target{{Name: "route", Addrs: []string{"a:1", "b:1"}}, {Name: "unsplit-2t"}, {Name: "unsplit-1t"}}
	info := func(hops, base []int) []load.TargetInfo {
		return []load.TargetInfo{{Name: "route", Threads: hops}, {Name: "unsplit-2t", Threads: []int{2}}, {Name: "unsplit-1t", Threads: base}}
	}
	rep := &load.Report{Targets: info([]int{1, 1}, []int{1})}
	run, err := c.ceilingRuns(targets, rep)
	if err != nil || run.baseline.Name != "unsplit-1t" || run.hops != 2 || rep.Ceiling.Baseline != "unsplit-1t" {
		t.Fatalf("ceiling run %+v, %v", run, err)
	}
	for _, tc := range []struct {
		hops, base []int
		want       string
	}{
		{[]int{1, 1}, []int{3}, "--unsplit baseline on 1 thread"},
		{[]int{1, 2}, []int{1}, "one thread count"},
	} {
		if _, err := c.ceilingRuns(targets, &load.Report{Targets: info(tc.hops, tc.base)}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("hops %v, baseline %v: err %v, want %q", tc.hops, tc.base, err, tc.want)
		}
	}
}
