package sched

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/internal/wireerr"
)

// script drives the scheduler by hand, with no goroutine, no backend and
// no clock but its own: it submits items, asks for a plan at a time it
// chooses, tells the state how long the planned forward took, and reads
// the replies the state decided. Each scenario is a few lines of it, in
// Go (plan_test.go) or as data (testdata/, TestScenarios).
type script struct {
	t     testing.TB
	s     *Scheduler
	info  Info
	now   time.Time
	fp    Forward // the last plan
	next  map[string]*progress
	trims []Trim // the last settled effects' trims
	// answered holds each session's replies since it was last read.
	answered map[string][]string
}

// progress is what the script has sent for one session.
type progress struct {
	step uint64
	pos  int
}

// output is a completed item's output as the script makes it.
type output struct {
	step uint64
	refs int
}

func (o *output) Retain()     { o.refs++ }
func (o *output) Release()    { o.refs-- }
func (o *output) Cost() int64 { return 256 }

// The engine's defaults for the scheduler's settings, which the scenarios
// were written under (engine.Config.Defaults, forBackend), on the engine
// tests' fake first shard (backendtest.New(true, false)).
var (
	scriptInfo = Info{MaxSeqs: 5, CtxTokens: 256, MaxBatch: 64}
	scriptCfg  = Config{MaxSessions: 16, IterationTokens: 4, PrefillIterationTokens: 128,
		DecodeQuiet: 250 * time.Millisecond, SessionTTL: 10 * time.Minute, EvictGrace: -1,
		MaxInflightChunks: 8, ResultsCacheBytes: 64 << 20, DecodeGroups: 2}
)

// newScript makes a scheduler under cfg (zero fields take the engine's
// defaults) over a first shard's limits with edit applied.
func newScript(t testing.TB, cfg Config, edit func(*Info)) *script {
	info := scriptInfo
	if edit != nil {
		edit(&info)
	}
	cfg = withDefaults(cfg, info)
	sc := &script{t: t, info: info, now: time.Unix(1_000_000, 0), next: map[string]*progress{}, answered: map[string][]string{}}
	sc.s = New(cfg, info, bufpool.Default, Hooks{Complete: sc.complete}, sc.now)
	t.Cleanup(func() {
		sc.s.Shutdown()
		sc.settle()
	})
	return sc
}

// withDefaults fills cfg's zero fields from scriptCfg, as the engine's
// Defaults and forBackend do.
func withDefaults(cfg Config, info Info) Config {
	d := scriptCfg
	set := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	set(&cfg.MaxSessions, d.MaxSessions)
	set(&cfg.IterationTokens, d.IterationTokens)
	set(&cfg.PrefillIterationTokens, d.PrefillIterationTokens)
	set(&cfg.DecodeGroups, d.DecodeGroups)
	cfg.MaxSessions = min(cfg.MaxSessions, info.MaxSeqs-1)
	for _, p := range []struct{ v, d *time.Duration }{{&cfg.DecodeQuiet, &d.DecodeQuiet}, {&cfg.SessionTTL, &d.SessionTTL}, {&cfg.EvictGrace, &d.EvictGrace}} {
		if *p.v == 0 {
			*p.v = *p.d
		}
	}
	if cfg.MaxInflightChunks == 0 {
		cfg.MaxInflightChunks = d.MaxInflightChunks
	}
	if cfg.ResultsCacheBytes == 0 {
		cfg.ResultsCacheBytes = d.ResultsCacheBytes
	}
	return cfg
}

func (sc *script) complete(it *Item, _ time.Time, _ uint64) Output {
	it.releaseOut()
	return &output{step: it.Step, refs: 1}
}

// submit queues session id's next unit of work: a prefill chunk of n tokens
// (final), or a decode step when n is 0.
func (sc *script) submit(id string, n int) {
	sc.queue(sc.make(id, n))
}

// queue hands it to the state.
func (sc *script) queue(it *Item) { sc.s.Enqueue(it, sc.now) }

// make builds session id's next unit of work (as submit) without queueing it.
func (sc *script) make(id string, n int) *Item {
	p := sc.next[id]
	if p == nil {
		p = &progress{}
		sc.next[id] = p
	}
	p.step++
	it := &Item{Session: id, WorkID: fmt.Sprintf("%s/%d", id, p.step), Step: p.step, Epoch: 1, First: p.pos, Final: true}
	it.Owner = it
	if n == 0 {
		it.Mode, it.Tokens, it.Expected = Decode, 1, uint64(p.pos)
	} else {
		it.Mode, it.Tokens = Prefill, n
	}
	it.Input = make([]byte, 4*it.Tokens)
	p.pos += it.Tokens
	return it
}

// settle carries out the effects as the engine's driver would, recording
// each reply under its session: "ack 1" (step 1 done), "dup 2", a bare
// "dup-ack 2", "CANCELLED 3".
func (sc *script) settle() {
	fx := sc.s.Effects()
	sc.trims = append(sc.trims[:0], fx.Trims...)
	for _, r := range fx.Replies {
		it := r.Item
		var d string
		switch {
		case r.Quiet:
			continue
		case r.Out != nil && r.Duplicate:
			d = fmt.Sprintf("dup %d", r.Out.(*output).step)
		case r.Out != nil:
			d = fmt.Sprintf("ack %d", r.Out.(*output).step)
		case r.Duplicate:
			d = fmt.Sprintf("dup-ack %d", it.Step)
		default:
			d = fmt.Sprintf("%s %d", codeName(wireerr.CodeOf(r.Err)), it.Step)
		}
		if r.Out != nil {
			r.Out.Release()
		}
		sc.answered[it.Session] = append(sc.answered[it.Session], d)
	}
	fx.Reset()
}

// codeName is a contract code's name without its prefix.
func codeName(c wireerr.Code) string {
	return map[wireerr.Code]string{
		wireerr.CodeEpochStale: "EPOCH_STALE", wireerr.CodeCacheMiss: "CACHE_MISS",
		wireerr.CodeResourceExhausted: "RESOURCE_EXHAUSTED", wireerr.CodeCancelled: "CANCELLED",
		wireerr.CodeDeadlineExceeded: "DEADLINE_EXCEEDED", wireerr.CodeInternal: "INTERNAL",
		wireerr.CodePayloadCorrupt: "PAYLOAD_CORRUPT",
	}[c]
}

// plan asks for the next iteration now and describes it: "a:d1 b:p7"
// (session, decode or prefill, rows), or "wait 3ms" (a hold until the
// scheduler's wake time), or "idle".
func (sc *script) plan() string {
	sc.s.ClearWake()
	fp, run := sc.s.Plan(sc.now)
	sc.settle()
	sc.fp = fp
	if !run {
		if wake := sc.s.Wake(); !wake.IsZero() {
			return fmt.Sprintf("wait %v", wake.Sub(sc.now))
		}
		return "idle"
	}
	parts := make([]string, 0, len(fp.Items))
	for _, p := range fp.Items {
		kind := "p"
		if p.Item.Mode == Decode {
			kind = "d"
		}
		parts = append(parts, fmt.Sprintf("%s:%s%d", p.Item.Session, kind, p.N))
	}
	return strings.Join(parts, " ")
}

// Forwards in a script take costBase + costRow per row (the model the
// scheduler fits online), unless a step says otherwise.
const (
	costBase = 2 * time.Millisecond
	costRow  = 500 * time.Microsecond
)

// run has the planned forward take took (0: the script's cost line); the
// clock moves on by it and the state takes in the outcome.
func (sc *script) run(took time.Duration) {
	if took == 0 {
		took = costBase + time.Duration(sc.fp.Rows)*costRow
	}
	sc.now = sc.now.Add(took)
	sc.s.Advance(sc.now, Outcome{Took: took})
	sc.settle()
}

// step plans and, when there is a forward, runs it taking took (0: the
// cost line); it returns the plan.
func (sc *script) step(took time.Duration) string {
	p := sc.plan()
	if !strings.HasPrefix(p, "wait") && p != "idle" {
		sc.run(took)
	}
	return p
}

// replies describes what session id has been answered since the last call.
func (sc *script) replies(id string) string {
	out := strings.Join(sc.answered[id], ", ")
	sc.answered[id] = sc.answered[id][:0]
	return out
}

// expect fails unless got is want.
func (sc *script) expect(what, got, want string) {
	sc.t.Helper()
	if got != want {
		sc.t.Fatalf("%s: got %q, want %q", what, got, want)
	}
}

// prefilled runs a one-chunk prefill of n tokens for each session and
// reads its acks, leaving them ready to decode.
func (sc *script) prefilled(n int, ids ...string) {
	sc.t.Helper()
	for _, id := range ids {
		sc.submit(id, n)
	}
	for range 64 {
		if sc.s.pending == 0 {
			break
		}
		sc.step(0)
	}
	for _, id := range ids {
		sc.expect(id+" prefill", sc.replies(id), fmt.Sprintf("ack %d", sc.next[id].step))
	}
}

// decodeEveryMs has session id decode costMinRuns steps alone, each sent
// 1 ms after the last one completed (the trip round the rest of the route
// and the head), so the cost model and the session's gap are known.
func (sc *script) decodeEveryMs(id string) {
	sc.t.Helper()
	for i := range costMinRuns {
		sc.submit(id, 0)
		sc.expect(fmt.Sprint("decode ", i), sc.step(0), id+":d1")
		sc.replies(id)
		sc.now = sc.now.Add(time.Millisecond)
	}
}

// TestImports: the core links neither gRPC, nor the generated contract,
// nor the backend, nor any package of the engine above it (go list -deps:
// what it imports, and what they import).
func TestImports(t *testing.T) {
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/meshnet/shardd/kvcache") {
		t.Fatalf("go list -deps gave %d packages without kvcache: %v", len(deps), deps)
	}
	for _, d := range deps {
		switch {
		case strings.HasPrefix(d, "google.golang.org/grpc"), strings.HasSuffix(d, "/gen/shardv1"),
			strings.Contains(d, "/shardd/backend"), strings.HasSuffix(d, "/shardd/engine"):
			t.Errorf("sched links %s", d)
		}
	}
}
