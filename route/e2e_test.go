package route

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/verify"
)

var shardd string // the binary under test, built by TestMain

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "shardd-e2e-")
	if err != nil {
		panic(err)
	}
	shardd = filepath.Join(dir, "shardd")
	// Built with the caller's cgo flags (make test sets them).
	build := exec.Command("go", "build", "-o", shardd, "../cmd/shardd")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	code := 1
	if err := build.Run(); err == nil {
		code = m.Run()
	} else {
		fmt.Fprintln(os.Stderr, "e2e: building shardd:", err)
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// tinyShards writes the tiny preset into a test folder and splits it n
// ways; it returns the whole model and the shards.
func tinyShards(t *testing.T, n int) (model string, shards []string) {
	t.Helper()
	dir := t.TempDir()
	model = filepath.Join(dir, "tiny.gguf")
	if err := gguf.Generate(model, gguf.Presets["tiny"]); err != nil {
		t.Fatal(err)
	}
	shards, err := gguf.Split(model, gguf.EvenRanges(6, n), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return model, shards
}

// proc is one shardd serve process.
type proc struct {
	cmd  *exec.Cmd
	addr string
	log  *strings.Builder
}

// serve starts shardd on shard, listening on addr ("127.0.0.1:0" for any
// port), and waits for its "listening on" line.
func serve(t *testing.T, shard, addr string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"serve", "--model", shard, "--listen", addr, "--threads", "1", "--max-sessions", "4"}, extra...)
	cmd := exec.Command(shardd, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, log: &strings.Builder{}}
	cmd.Stderr = p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	deadline := time.After(60 * time.Second)
	for p.addr == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("shardd did not start: %s", p.log)
			}
			p.addr, _ = strings.CutPrefix(line, "shardd: listening on ") // other lines first: "metrics on"
			if p.addr == line {
				p.addr = ""
			}
		case <-deadline:
			t.Fatalf("shardd did not start in time: %s", p.log)
		}
	}
	go func() {
		for range lines {
		}
	}()
	t.Cleanup(func() { p.stop() })
	return p
}

func (p *proc) stop() {
	if p.cmd.ProcessState == nil {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	}
}

// TestRouteSurvivesWorkerRestart: three shardd processes, two concurrent
// generations; the middle worker is killed and restarted mid-generation. The
// head recovers (retry, then CACHE_MISS -> one re-prefill) and both
// generations go on with the whole model's greedy tokens given their own
// prefix, near ties aside (checkGreedy). Until 2026-12-02 it required them
// to equal verify.Greedy's tokens exactly, which the re-prefill does not
// promise; it failed once in CI, the tokens parting two steps after the
// restart (whether at a near tie is not known: the logits were not kept;
// this check tells the two apart).
func TestRouteSurvivesWorkerRestart(t *testing.T) {
	model, shards := tinyShards(t, 3)
	procs := make([]*proc, 3)
	var addrs []string
	for i, s := range shards {
		procs[i] = serve(t, s, "127.0.0.1:0")
		addrs = append(addrs, procs[i].addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := Dial(ctx, addrs, Options{StepTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	prompts := [][]int32{{1, 17, 42, 7, 99}, {5, 300, 8, 64, 2, 11, 3}}
	const n = 24
	// Both generations pause after a few tokens; then the middle worker is
	// killed and restarted, and both go on.
	reached := make(chan struct{}, 2)
	restarted := make(chan struct{})
	got := make([][]int32, 2)
	stats := make([]Stats, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stats[g], errs[g] = r.Generate(ctx, Request{Prompt: prompts[g], MaxTokens: n}, func(tok int32) error {
				got[g] = append(got[g], tok)
				if len(got[g]) == 6 {
					reached <- struct{}{}
					<-restarted
				}
				return nil
			})
		}()
	}
	<-reached
	<-reached
	addr := procs[1].addr
	procs[1].cmd.Process.Kill()
	procs[1].cmd.Wait()
	procs[1] = serve(t, shards[1], addr)
	close(restarted)
	wg.Wait()

	for g := range 2 {
		if errs[g] != nil {
			t.Fatalf("generation %d: %v (worker log: %s)", g, errs[g], procs[1].log)
		}
		if len(got[g]) != n {
			t.Fatalf("generation %d: %d tokens, want %d", g, len(got[g]), n)
		}
		// The route's boundaries are bf16: after layers 1 and 3 of 6.
		checkGreedy(t, model, prompts[g], got[g], 1, 3)
		if stats[g].Recoveries < 1 || stats[g].Retries < 1 {
			t.Fatalf("generation %d did not go through recovery: %+v", g, stats[g])
		}
	}
}

// nearTie is how far below the model's best logit a route's greedy token
// may be, for logits that span nearTieSpan (the tiny preset's): rounding
// its residual stream to bf16 at a boundary moves them by up to 0.011
// (measured over 384 positions of 12 prompts), and a recovery's
// re-prefill and a batch's composition change the order of a few sums.
// 1-2% of its positions have a best and second best closer than that. A
// model whose logits span more moves them more in proportion (SmolLM2's
// span about 25-40: a failover's re-prefill moved one by 0.099), so the
// bound is nearTie x span / nearTieSpan of the row.
const nearTie, nearTieSpan = 0.05, 6.0

// checkGreedy requires each of a route's greedy tokens after prompt to be
// the whole model's best given the route's own prefix (verify.Forced,
// rounded to bf16 after the layers in roundAfter as the route rounds), or
// within nearTie of it, and allows two such near ties in a generation. A
// route that computes from wrong state (a lost or foreign KV cache, a
// wrong position) picks tokens far below the best within a few steps.
// Where the route is not bitwise the model (re-prefilled after a restart,
// batched with other sessions) a near tie can go either way, and the
// tokens after it then follow another path than verify.Greedy's: the
// exact claim is TestExactRoute's.
func checkGreedy(t *testing.T, model string, prompt, got []int32, roundAfter ...int) {
	t.Helper()
	checkGreedyTies(t, model, prompt, got, 2, 1, roundAfter...)
}

// checkGreedyTies is checkGreedy allowing maxTies near ties, each within
// scale times the near-tie bound.
func checkGreedyTies(t *testing.T, model string, prompt, got []int32, maxTies int, scale float32, roundAfter ...int) {
	t.Helper()
	logits, err := verify.Forced(model, prompt, got, 2, roundAfter...)
	if err != nil {
		t.Fatal(err)
	}
	ties := 0
	for i, l := range logits {
		best := slices.Max(l)
		tie := scale * nearTie * max(best-slices.Min(l), nearTieSpan) / nearTieSpan
		switch below := best - l[got[i]]; {
		case below == 0:
		case below <= tie:
			ties++
			t.Logf("token %d (%d) is %.4f below the best, within %.3f (the row spans %.1f): a near tie", i, got[i], below, tie, best-slices.Min(l))
		default:
			t.Fatalf("token %d (%d) is %.4f below the model's best (near tie: %.3f) given the route's prefix %v", i, got[i], below, tie, got[:i])
		}
	}
	if ties > maxTies {
		t.Fatalf("%d near ties in %d tokens", ties, len(got))
	}
}

// TestDialRefusesBrokenRoutes: a route must tile the layers from 0.
func TestDialRefusesBrokenRoutes(t *testing.T) {
	_, shards := tinyShards(t, 3)
	a, c := serve(t, shards[0], "127.0.0.1:0"), serve(t, shards[2], "127.0.0.1:0")
	ctx := context.Background()
	if _, err := Dial(ctx, []string{a.addr, c.addr}, Options{}); err == nil || !strings.Contains(err.Error(), "starts at layer 4") {
		t.Fatalf("gap accepted: %v", err)
	}
	if _, err := Dial(ctx, []string{c.addr}, Options{}); err == nil {
		t.Fatal("a route not starting at layer 0 accepted")
	}
}

// TestServeDrainsOnSIGTERM: a worker refuses new sessions and exits cleanly.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "tiny.gguf")
	if err := gguf.Generate(model, gguf.Presets["tiny"]); err != nil {
		t.Fatal(err)
	}
	p := serve(t, model, "127.0.0.1:0")
	r, err := Dial(context.Background(), []string{p.addr}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Generate(context.Background(), Request{Prompt: []int32{1, 2}, MaxTokens: 4}, func(int32) error { return nil }); err != nil {
		t.Fatal(err)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, p.log)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("worker did not exit after SIGTERM")
	}
	if !strings.Contains(p.log.String(), "draining") || !strings.Contains(p.log.String(), "stopped") {
		t.Fatalf("log: %s", p.log)
	}
}

// TestServeHealthAndReflection: grpc.health.v1 answers SERVING and server
// reflection lists the ShardRuntime service (what grpcurl needs).
func TestServeHealthAndReflection(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "tiny.gguf")
	if err := gguf.Generate(model, gguf.Presets["tiny"]); err != nil {
		t.Fatal(err)
	}
	p := serve(t, model, "127.0.0.1:0")
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "meshnet.shard.v1.ShardRuntime"})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	rc, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	resp, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !slices.Contains(names, "meshnet.shard.v1.ShardRuntime") || !slices.Contains(names, "grpc.health.v1.Health") {
		t.Fatalf("reflection lists %v", names)
	}
}
