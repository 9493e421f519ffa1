package hoststat

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// coreBytes is the size of the two buffers the core probe copies between:
// together well inside any x86-64 core's L1 data cache (32-48 KiB), so
// that the copy measures the core, not memory.
const coreBytes = 8 << 10

// coreCopies is how many times a probe copies coreBytes: 15-35 µs
// of a core's time (2 MiB at 60-135 GB/s).
const coreCopies = 256

// Cores is how fast the sampled CPUs ran while a CoreSampler ran: one
// thread on each, copying within its L1 cache, timed in that thread's own
// CPU time (so sharing the CPU with a forward does not count as slowness).
//
// On the Intel host this project is measured on, a core's speed flips
// between two states in spells of seconds, independently on each vCPU (a
// forward's time by about 1.6x, this copy's by up to 2x), while its memory
// read speed (ReadGBps) stays flat; a forward's time follows the copy's
// (PERF.md, noise: sampled every 100 ms beside a forward on its CPU, its
// 1 s means correlate -0.89 with the forward's). A route of one CPU a hop
// runs at the pace of its slower core at each moment, a model on one CPU
// at that CPU's: Slowest says what pace the CPUs together allowed.
type Cores struct {
	CPUs []int `json:"cpus"`
	// GBps is each CPU's mean copy speed over its samples, in CPUs' order;
	// Samples, how many samples each had.
	GBps    []float64 `json:"gbps"`
	Samples []int     `json:"samples"`
	// Slowest is the mean over the windows of coreWindow that every CPU
	// was sampled in of the slowest CPU's mean in each; Windows is how
	// many there were. Windows, not single samples: the slower of two
	// noisy samples reads 3-10% under either CPU's mean even on an idle
	// host, where a window's mean of ten is steadier, and a spell lasts
	// several windows.
	Slowest float64 `json:"slowest_gbps"`
	Windows int     `json:"windows"`
}

// coreWindow is the span over which Cores.Slowest compares the CPUs.
const coreWindow = time.Second

// CoreSampler probes each of its CPUs' speed every so often, from a
// thread pinned there, until Stop.
type CoreSampler struct {
	cpus   []int
	every  time.Duration
	window time.Duration
	start  time.Time
	stop   chan struct{}
	wg     sync.WaitGroup
	// per CPU: the tick of each sample and its speed; the threads' ids;
	// an error from restoring a thread's affinity.
	ticks [][]int
	gbps  [][]float64
	tids  []int
	errs  []error
}

// SampleCores starts sampling cpus every interval (a probe first on each
// at once). It fails, sampling nothing, where a CPU cannot be pinned to.
func SampleCores(cpus []int, every time.Duration) (*CoreSampler, error) {
	if len(cpus) == 0 || every <= 0 {
		return nil, fmt.Errorf("hoststat: sample %v every %v", cpus, every)
	}
	n := len(cpus)
	s := &CoreSampler{cpus: slices.Clone(cpus), every: every, window: max(coreWindow, every), start: time.Now(), stop: make(chan struct{}),
		ticks: make([][]int, n), gbps: make([][]float64, n), tids: make([]int, n), errs: make([]error, n)}
	started := make(chan error, n)
	for i, cpu := range cpus {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			ran := false
			tid, err := onCPU(cpu, func() {
				ran = true
				started <- nil
				s.sample(i)
			})
			s.tids[i] = tid
			if !ran {
				started <- err
				return
			}
			s.errs[i] = err
		}()
	}
	var errs []error
	for range n {
		errs = append(errs, <-started)
	}
	if err := errors.Join(errs...); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// sample probes CPU i (its thread pinned there) at each tick till Stop.
func (s *CoreSampler) sample(i int) {
	a, b := CoreBuffers()
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	for {
		if gbps := copySpeed(a, b); gbps > 0 {
			k := int(math.Round(float64(time.Since(s.start)) / float64(s.every)))
			s.ticks[i], s.gbps[i] = append(s.ticks[i], k), append(s.gbps[i], gbps)
		}
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
	}
}

// Stop ends the sampling and returns what it saw.
func (s *CoreSampler) Stop() (Cores, error) {
	close(s.stop)
	s.wg.Wait()
	c := Cores{CPUs: s.cpus}
	per := max(int(s.window/s.every), 1) // ticks a window
	type window struct{ sum, n []float64 }
	windows := map[int]window{}
	for i := range s.cpus {
		var sum float64
		for j, g := range s.gbps[i] {
			sum += g
			k := s.ticks[i][j] / per
			w, ok := windows[k]
			if !ok {
				w = window{make([]float64, len(s.cpus)), make([]float64, len(s.cpus))}
				windows[k] = w
			}
			w.sum[i] += g
			w.n[i]++
		}
		c.GBps = append(c.GBps, sum/float64(max(len(s.gbps[i]), 1)))
		c.Samples = append(c.Samples, len(s.gbps[i]))
	}
	var sum float64
	for _, w := range windows {
		if slices.Contains(w.n, 0) {
			continue
		}
		slowest := math.Inf(1)
		for i := range w.sum {
			slowest = min(slowest, w.sum[i]/w.n[i])
		}
		sum += slowest
		c.Windows++
	}
	if c.Windows > 0 {
		c.Slowest = sum / float64(c.Windows)
	}
	return c, errors.Join(s.errs...)
}

// CopySpeed is the core probe on the calling thread, wherever it runs:
// a and b (of coreBytes each, CoreBuffers) copied within the L1 cache, in
// GB/s of the thread's own CPU time; 0 where the clock fails. A worker's
// forward loop calls it between forwards, on the thread that runs them.
// The goroutine stays on its thread meanwhile: the clock is the thread's.
func CopySpeed(a, b []byte) float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return copySpeed(a, b)
}

// CoreBuffers are the two buffers CopySpeed copies between.
func CoreBuffers() (a, b []byte) { return make([]byte, coreBytes), make([]byte, coreBytes) }

// copySpeed copies a to b coreCopies times, after one copy that warms
// them, in GB/s of this thread's CPU time (0 where the clock fails).
func copySpeed(a, b []byte) float64 {
	copy(b, a)
	t0, err := threadCPU()
	if err != nil {
		return 0
	}
	for range coreCopies {
		copy(b, a)
		a, b = b, a
	}
	t1, err := threadCPU()
	if err != nil || t1 <= t0 {
		return 0
	}
	return float64(coreCopies*len(a)) / (t1 - t0).Seconds() / 1e9
}

// threadCPU is the calling thread's CPU time.
func threadCPU() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}
