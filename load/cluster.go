package load

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshnet/shardd/gguf"
)

// WorkerSpec is one `shardd serve` process the harness starts.
type WorkerSpec struct {
	Model   string
	Name    string // --instance, and the log file's name
	Threads int    // --threads (0: serve's default)
	// CPUs, when set, is the CPU set the process runs on (as taskset).
	CPUs []int
	// SpanFile, when set, makes the worker write its spans there.
	SpanFile string
	// Args are further serve flags.
	Args []string
}

// Cluster is a set of worker processes on loopback.
type Cluster struct {
	Addrs []string
	Logs  []string
	// Metrics are the workers' /metrics addresses, in spec order ("" for a
	// worker started without --metrics-listen).
	Metrics []string
	Pids    []int
	procs   []*exec.Cmd
	done    []chan struct{}
	// What Restart starts again.
	specs       []WorkerSpec
	bin, logDir string
}

// StartWorkers starts one `bin serve` per spec on 127.0.0.1 with a port of
// its own, waits until each listens, and returns them in spec order. On
// error every process already started is stopped. Each process dies with
// the harness (PR_SET_PDEATHSIG), so even a killed harness leaves none
// behind; Close stops them gracefully. Each worker's log (logDir/NAME.log)
// starts empty, so a reused directory shows no earlier run's lines; a
// Restart appends to it.
func StartWorkers(ctx context.Context, bin, logDir string, specs []WorkerSpec) (*Cluster, error) {
	c := &Cluster{specs: specs, bin: bin, logDir: logDir}
	for _, s := range specs {
		if err := os.Truncate(filepath.Join(logDir, s.Name+".log"), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		addr, metrics, logPath, err := c.start(ctx, bin, logDir, s, "127.0.0.1:0")
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Addrs = append(c.Addrs, addr)
		c.Metrics = append(c.Metrics, metrics)
		c.Logs = append(c.Logs, logPath)
		c.Pids = append(c.Pids, c.procs[len(c.procs)-1].Process.Pid)
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context, bin, logDir string, s WorkerSpec, listen string, extra ...string) (addr, metrics, logPath string, err error) {
	args := []string{"serve", "--model", s.Model, "--listen", listen, "--instance", s.Name}
	if s.Threads > 0 {
		args = append(args, "--threads", strconv.Itoa(s.Threads))
	}
	if s.SpanFile != "" {
		args = append(args, "--traces", "file:"+s.SpanFile)
	}
	args = append(append(args, s.Args...), extra...)
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	// Spans reach the file within 200 ms of ending, so a run can read its
	// window's spans soon after it ends.
	cmd.Env = append(os.Environ(), "OTEL_BSP_SCHEDULE_DELAY=200")
	logPath = filepath.Join(logDir, s.Name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", "", "", err
	}
	defer logf.Close()
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", "", "", err
	}
	if err := startOnCPUs(cmd, s.CPUs); err != nil {
		return "", "", "", fmt.Errorf("load: start %s: %w", s.Name, err)
	}
	done := make(chan struct{})
	c.procs = append(c.procs, cmd)
	c.done = append(c.done, done)
	listening := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		var metrics string // printed before the listening line
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "shardd: metrics on "); ok {
				metrics = a
			}
			if a, ok := strings.CutPrefix(sc.Text(), "shardd: listening on "); ok {
				listening <- [2]string{a, metrics}
			}
		}
		cmd.Wait()
		close(done)
	}()
	tm := time.NewTimer(5 * time.Minute)
	defer tm.Stop()
	select {
	case a := <-listening:
		return a[0], a[1], logPath, nil
	case <-done:
		return "", "", "", fmt.Errorf("load: worker %s exited before listening: %s", s.Name, tail(logPath))
	case <-ctx.Done():
		return "", "", "", ctx.Err()
	case <-tm.C:
		return "", "", "", fmt.Errorf("load: worker %s did not listen within 5 minutes", s.Name)
	}
}

// startOnCPUs starts cmd with its CPU affinity set to cpus: the forking
// thread takes the set for the fork, and the child inherits it.
func startOnCPUs(cmd *exec.Cmd, cpus []int) error {
	if len(cpus) == 0 {
		return cmd.Start()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return err
	}
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("CPU set %v: %w", cpus, err)
	}
	err := cmd.Start()
	if rerr := unix.SchedSetaffinity(0, &old); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// Kill kills worker i at once (SIGKILL), as a machine that dies, and
// waits until it is gone.
func (c *Cluster) Kill(i int) {
	syscall.Kill(-c.procs[i].Process.Pid, syscall.SIGKILL)
	<-c.done[i]
}

// Restart starts worker i again on its address, and its metrics on
// theirs (after Kill).
func (c *Cluster) Restart(ctx context.Context, i int) error {
	n := len(c.procs)
	var extra []string
	if c.Metrics[i] != "" {
		extra = []string{"--metrics-listen", c.Metrics[i]}
	}
	_, _, _, err := c.start(ctx, c.bin, c.logDir, c.specs[i], c.Addrs[i], extra...)
	if err != nil {
		return err
	}
	// start appended the new process: it takes the old one's place.
	c.procs[i], c.done[i] = c.procs[n], c.done[n]
	c.procs, c.done = c.procs[:n], c.done[:n]
	c.Pids[i] = c.procs[i].Process.Pid
	return nil
}

// Close stops every worker: SIGTERM (a drain), then SIGKILL after 10 s.
func (c *Cluster) Close() {
	var wg sync.WaitGroup
	for i, cmd := range c.procs {
		done := c.done[i]
		wg.Go(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-done
			}
		})
	}
	wg.Wait()
	c.procs, c.done = nil, nil
}

// tail returns the last lines of a log file, for an error message.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-5):], " | ")
}

// ParseCPUSets reads per-worker CPU sets: "0;1" (worker 0 on CPU 0, worker
// 1 on CPU 1), each set a list of CPUs and ranges ("0-3,6").
func ParseCPUSets(s string) ([][]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out [][]int
	for _, set := range strings.Split(s, ";") {
		var cpus []int
		for _, part := range strings.Split(set, ",") {
			lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
			a, err := strconv.Atoi(lo)
			b := a
			if err == nil && isRange {
				b, err = strconv.Atoi(hi)
			}
			if err != nil || a < 0 || b < a || b >= 1024 {
				return nil, fmt.Errorf("%w: CPU set %q", ErrInput, set)
			}
			for c := a; c <= b; c++ {
				cpus = append(cpus, c)
			}
		}
		out = append(out, cpus)
	}
	return out, nil
}

// Shards splits model into ranges (cached under cacheDir by the model's
// path, size and time, so repeated runs reuse the files) and returns the
// shard files in range order.
func Shards(model string, ranges []gguf.Range, cacheDir string) ([]string, error) {
	meta, err := gguf.Read(model)
	if err != nil {
		return nil, err
	}
	if err := gguf.CheckRanges(ranges, meta.Total); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInput, err)
	}
	st, err := os.Stat(model)
	if err != nil {
		return nil, err
	}
	abs, _ := filepath.Abs(model)
	key := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d", abs, st.Size(), st.ModTime().UnixNano()))
	dir := filepath.Join(cacheDir, hex.EncodeToString(key[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	missing := false
	for _, r := range ranges {
		p := gguf.ShardPath(model, dir, r)
		paths = append(paths, p)
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			missing = true
		}
	}
	if !missing {
		return paths, nil
	}
	// Split into a folder of its own and move the files in, so an
	// interrupted split never leaves a partial shard in the cache.
	tmp, err := os.MkdirTemp(dir, "split-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	made, err := gguf.Split(model, ranges, tmp, nil)
	if err != nil {
		return nil, err
	}
	for i, p := range made {
		if err := os.Rename(p, paths[i]); err != nil {
			return nil, err
		}
	}
	return paths, nil
}
