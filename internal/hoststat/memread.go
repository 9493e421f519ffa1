package hoststat

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ReadBytes is the size of the buffer ReadGBps reads: larger than a core's
// caches and of the order of a small model's weights, so that it moves
// with what a forward's weight reads see.
const ReadBytes = 96 << 20

var (
	readOnce sync.Once
	readBuf  []byte
)

// ReadGBps is how fast one thread on each of cpus reads ReadBytes from
// memory, in GB/s: per CPU the median of three passes after one that warms
// the page tables, then the mean over the CPUs. The CPUs are probed one
// after another, each by a thread pinned there, so a probe does not
// compete with another.
//
// On the shared machines this project is measured on, a core's read speed
// moves by 2x within minutes with what other tenants run (PERF.md, noise),
// and a forward's time with it. Probed before and after each run of a
// comparison, it tells a ratio read across two host speeds from one read
// at one.
func ReadGBps(cpus []int) (float64, error) {
	if len(cpus) == 0 {
		return 0, fmt.Errorf("hoststat: no CPU to probe")
	}
	var sum float64
	for _, cpu := range cpus {
		gbps, _, err := readOn(cpu)
		if err != nil {
			return 0, err
		}
		sum += gbps
	}
	return sum / float64(len(cpus)), nil
}

// readOn runs the passes on a thread pinned to cpu meanwhile (onCPU) and
// returns their speed and the thread's id.
func readOn(cpu int) (float64, int, error) {
	var gbps float64
	tid, err := onCPU(cpu, func() { gbps = readPasses() })
	return gbps, tid, err
}

// onCPU runs body on a thread pinned to cpu meanwhile, and returns the
// thread's id; body does not run where the pinning fails. The thread must
// outlive the call: a child started with Pdeathsig (the harness's
// workers) dies when the thread that forked it ends, and a goroutine that
// exits locked to its thread ends the thread. So the goroutine restores
// the thread's affinity and unlocks it; where the affinity cannot be
// restored, it parks for good, keeping the thread locked and out of use
// rather than ending it or handing its pinning on.
func onCPU(cpu int, body func()) (int, error) {
	type result struct {
		tid int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		tid := unix.Gettid()
		var was, set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &was); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("hoststat: affinity: %w", err)}
			return
		}
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("hoststat: pin to CPU %d: %w", cpu, err)}
			return
		}
		body()
		if err := unix.SchedSetaffinity(0, &was); err != nil {
			done <- result{err: fmt.Errorf("hoststat: restore affinity: %w", err)}
			select {}
		}
		runtime.UnlockOSThread()
		done <- result{tid: tid}
	}()
	r := <-done
	return r.tid, r.err
}

// readPasses reads readBuf four times and returns the median speed of the
// last three, in GB/s.
func readPasses() float64 {
	readOnce.Do(func() {
		readBuf = make([]byte, ReadBytes)
		for i := range readBuf {
			readBuf[i] = byte(i)
		}
	})
	sink := make([]byte, 16<<10) // L1-resident: the reads are the cost
	var passes []float64
	for p := range 4 {
		start := time.Now()
		for i := 0; i+len(sink) <= len(readBuf); i += len(sink) {
			copy(sink, readBuf[i:])
		}
		if p > 0 {
			passes = append(passes, float64(len(readBuf))/time.Since(start).Seconds()/1e9)
		}
	}
	slices.Sort(passes)
	return passes[len(passes)/2]
}

// FirstCPU is the lowest-numbered CPU this thread may run on.
func FirstCPU() (int, error) {
	cpus, err := AllowedCPUs()
	if err != nil {
		return 0, err
	}
	return cpus[0], nil
}

// AllowedCPUs are the CPUs this thread may run on, in order.
func AllowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	var cpus []int
	for cpu := 0; len(cpus) < set.Count(); cpu++ {
		if set.IsSet(cpu) {
			cpus = append(cpus, cpu)
		}
	}
	if len(cpus) == 0 {
		return nil, fmt.Errorf("hoststat: no CPU in this thread's affinity")
	}
	return cpus, nil
}
