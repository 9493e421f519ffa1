// Package hoststat reads what the host runs beside shardd on the same CPUs,
// outside anything the process controls: kernel threads whose CPU time
// shows up as stalls in a forward.
//
// The one that matters on the machines this project is measured on is
// DAMON's kdamond, set there to monitor physical memory with a pageout
// scheme. Each of its samples (every 500 ms there) walks the reverse map of
// thousands of pages and clears their accessed bits. With a model's pages
// mapped and in use, that takes it tens of milliseconds of CPU a sample,
// and the llama.cpp forwards running meanwhile, and just after, take
// several times their usual time (PERF.md, noise). A latency p99 measured over a few seconds is then the
// host's, not shardd's.
//
// The other is the host's memory speed as one core sees it, which other
// tenants move by up to 2x within minutes: ReadGBps probes it.
package hoststat

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Threads are the kernel threads found by one Find.
type Threads struct{ stats []string }

// Kdamond finds DAMON's monitoring threads.
func Kdamond() Threads { return Find("kdamond") }

// Find returns the threads in /proc whose name starts with prefix (none
// where there are none, or where /proc cannot be read).
func Find(prefix string) Threads { return find("/proc", prefix) }

func find(proc, prefix string) Threads {
	var t Threads
	dirs, _ := filepath.Glob(filepath.Join(proc, "[0-9]*"))
	for _, d := range dirs {
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil || !strings.HasPrefix(string(comm), prefix) {
			continue
		}
		t.stats = append(t.stats, filepath.Join(d, "schedstat"))
	}
	return t
}

// Found reports whether there is anything to watch.
func (t Threads) Found() bool { return len(t.stats) > 0 }

// CPU is the threads' CPU time so far: the sum of schedstat's first field
// (time spent on a CPU, in nanoseconds). A thread that has gone counts 0.
func (t Threads) CPU() time.Duration {
	var sum time.Duration
	for _, p := range t.stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		f, _, _ := bytes.Cut(b, []byte(" "))
		n, err := strconv.ParseInt(string(bytes.TrimSpace(f)), 10, 64)
		if err == nil && n > 0 {
			sum += time.Duration(n)
		}
	}
	return sum
}
