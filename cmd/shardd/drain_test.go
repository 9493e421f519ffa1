package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/route"
)

// SIGTERM drains a worker: with one session mid-prefill and one
// mid-decode, Health says DRAINING at once, a new session is refused as
// draining, both running generations finish with every token, and the
// process exits within the drain timeout.
func TestDrainOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds shardd and runs a real worker")
	}
	dir := t.TempDir()
	bin, model := buildShardd(t, dir), tinyModel(t, dir)
	const drainTimeout = 60 * time.Second
	cmd := exec.Command(bin, "serve", "--model", model, "--listen", "127.0.0.1:0", "--threads", "1",
		"--drain-timeout", drainTimeout.String(), "--log-level", "warn")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed when serve exited, with waitErr set
	var waitErr error
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "shardd: listening on "); ok {
				addrc <- a
			}
		}
		waitErr = cmd.Wait()
		close(exited)
	}()
	var addr string
	select {
	case addr = <-addrc:
	case <-exited:
		t.Fatalf("serve exited before listening: %v", waitErr)
	case <-time.After(2 * time.Minute):
		t.Fatal("serve did not listen")
	}

	var prefillChunks, decoded atomic.Int32
	rt, err := route.Dial(context.Background(), []string{addr}, route.Options{PrefillChunk: 16, StepTimeout: 30 * time.Second,
		Observe: func(s route.StepSample) {
			if !s.Decode {
				prefillChunks.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	long := make([]int32, 700)
	for i := range long {
		long[i] = int32(i*7%500 + 1)
	}
	type result struct {
		tokens int
		err    error
	}
	results := make([]result, 2)
	var wg sync.WaitGroup
	for i, req := range []route.Request{
		{Prompt: []int32{5, 6, 7}, MaxTokens: 200}, // decoding when SIGTERM comes
		{Prompt: long, MaxTokens: 8},               // prefilling when SIGTERM comes
	} {
		wg.Go(func() {
			st, err := rt.Generate(context.Background(), req, func(int32) error {
				if i == 0 {
					decoded.Add(1)
				}
				return nil
			})
			results[i] = result{st.Tokens, err}
		})
		if i == 0 {
			waitFor(t, func() bool { return decoded.Load() >= 5 })
		}
	}
	waitFor(t, func() bool { return prefillChunks.Load() >= 3 })
	if decoded.Load() >= 200 {
		t.Fatal("the decoding generation finished before SIGTERM: make it longer")
	}
	term := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := shardv1.NewShardRuntimeClient(conn)
	waitFor(t, func() bool {
		h, err := client.Health(context.Background(), &shardv1.HealthRequest{SchemaVersion: 1})
		return err == nil && h.State == shardv1.ServingState_SERVING_STATE_DRAINING
	})
	_, err = rt.Generate(context.Background(), route.Request{Prompt: []int32{1, 2}, MaxTokens: 2}, func(int32) error { return nil })
	var re *route.RefusedError
	if !errors.As(err, &re) || !strings.Contains(re.Detail, "draining") {
		t.Fatalf("a new session while draining: %v", err)
	}

	wg.Wait()
	for i, want := range []int{200, 8} {
		if r := results[i]; r.err != nil || r.tokens != want {
			t.Errorf("generation %d running at SIGTERM: %d of %d tokens, %v", i, r.tokens, want, r.err)
		}
	}
	rt.Close()
	conn.Close()
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("serve exited with %v", waitErr)
		}
	case <-time.After(drainTimeout + 10*time.Second - time.Since(term)):
		t.Fatalf("serve still running %v after SIGTERM (drain timeout %v)", time.Since(term), drainTimeout)
	}
	t.Logf("exited %v after SIGTERM", time.Since(term))
}

// waitFor polls cond every 10 ms for up to a minute.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serveProc starts `shardd serve` with args and returns the process and
// its address; the process is killed when the test ends.
func serveProc(t *testing.T, bin string, args ...string) (*exec.Cmd, string, chan struct{}) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--threads", "1", "--log-level", "warn"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "shardd: listening on "); ok {
				addrc <- a
			}
		}
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	select {
	case a := <-addrc:
		return cmd, a, exited
	case <-time.After(2 * time.Minute):
		t.Fatal("serve did not listen")
	}
	return nil, "", nil
}

// A drain with a standby: SIGTERM on hop 1's worker mid-generation. With
// --drain-handoff the generation moves to the standby and the worker
// exits while it goes on; without, the worker finishes the generation
// first. Both generations complete.
func TestDrainHandoff(t *testing.T) {
	if testing.Short() {
		t.Skip("builds shardd and runs real workers")
	}
	dir := t.TempDir()
	bin, model := buildShardd(t, dir), tinyModel(t, dir)
	shards, err := gguf.Split(model, gguf.EvenRanges(6, 2), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, handoff := range []bool{true, false} {
		t.Run(fmt.Sprintf("handoff=%v", handoff), func(t *testing.T) {
			_, hop0, _ := serveProc(t, bin, "--model", shards[0])
			args := []string{"--model", shards[1], "--drain-timeout", "60s"}
			if handoff {
				args = append(args, "--drain-handoff")
			}
			worker, hop1, exited := serveProc(t, bin, args...)
			_, standby, _ := serveProc(t, bin, "--model", shards[1])
			r, err := route.Dial(context.Background(), []string{hop0, hop1}, route.Options{StepTimeout: 20 * time.Second,
				Alternates: [][]string{nil, {standby}}})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			const n = 300
			var got int
			var signalled, exitedAt time.Time
			var exitedDuring bool
			start := time.Now()
			st, err := r.Generate(context.Background(), route.Request{Prompt: []int32{1, 2, 3}, MaxTokens: n}, func(int32) error {
				got++
				if got == 20 {
					signalled = time.Now()
					worker.Process.Signal(syscall.SIGTERM)
				}
				select {
				case <-exited:
					if exitedAt.IsZero() {
						exitedAt, exitedDuring = time.Now(), true
					}
				default:
				}
				time.Sleep(5 * time.Millisecond) // a generation that outlasts a drain
				return nil
			})
			end := time.Now()
			if err != nil || got != n {
				t.Fatalf("%d of %d tokens: %v", got, n, err)
			}
			<-exited
			if exitedAt.IsZero() {
				exitedAt = time.Now()
			}
			t.Logf("drain took %v (generation %v, signalled at %v); failovers %q",
				exitedAt.Sub(signalled).Round(time.Millisecond), end.Sub(start).Round(time.Millisecond), signalled.Sub(start).Round(time.Millisecond), st.Failovers)
			if handoff != exitedDuring || handoff != (len(st.Failovers) == 1) {
				t.Errorf("handoff %v: the worker exited during the generation: %v; failovers %q", handoff, exitedDuring, st.Failovers)
			}
		})
	}
}
