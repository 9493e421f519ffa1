package llamacpp

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshnet/shardd/backend"
)

// threadCPUs maps each thread of this process to its allowed-CPU list.
func threadCPUs(t *testing.T) map[string]string {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range tasks {
		data, err := os.ReadFile(p)
		if err != nil {
			continue // the thread exited
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
				out[filepath.Base(filepath.Dir(p))] = strings.TrimSpace(v)
			}
		}
	}
	return out
}

// TestPinThreads: with PinThreads the pool's worker thread is pinned to the
// first allowed CPU for good, and the thread that runs a forward gets every
// allowed CPU back afterwards; without it nothing is pinned; one thread is
// never pinned.
func TestPinThreads(t *testing.T) {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	if all.Count() < 2 {
		t.Skip("needs two CPUs")
	}
	first := -1
	for i := 0; first < 0; i++ {
		if all.IsSet(i) {
			first = i
		}
	}
	model, _ := tinyShards(t)
	before := threadCPUs(t)

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b, err := Open(Config{Path: model, Threads: 2, MaxSeqs: 2, CtxTokens: 64, MaxBatch: 4, PinThreads: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !b.Pinned() {
		t.Fatal("two threads on two or more CPUs were not pinned")
	}
	if err := backend.Probe(b); err != nil {
		t.Fatal(err)
	}
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	if mine != all {
		t.Fatalf("the calling thread kept a pinned affinity after the forward: %d CPUs, want %d", mine.Count(), all.Count())
	}
	pinned := 0
	for tid, cpus := range threadCPUs(t) {
		if _, old := before[tid]; !old && cpus == strconv.Itoa(first) {
			pinned++
		}
	}
	if pinned != 1 {
		t.Fatalf("%d new threads pinned to CPU %d, want the pool's one worker", pinned, first)
	}

	for _, cfg := range []Config{
		{Path: model, Threads: 2, MaxSeqs: 2, CtxTokens: 64, MaxBatch: 4},
		{Path: model, Threads: 1, MaxSeqs: 2, CtxTokens: 64, MaxBatch: 4, PinThreads: true},
	} {
		b, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if b.Pinned() {
			t.Errorf("pinned with %+v", cfg)
		}
		b.Close()
	}
}
