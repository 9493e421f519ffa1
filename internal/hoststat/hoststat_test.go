package hoststat

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeProc writes a /proc with the given threads: pid -> comm, schedstat.
func fakeProc(t *testing.T, threads map[string][2]string) string {
	dir := t.TempDir()
	for pid, v := range threads {
		p := filepath.Join(dir, pid)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(p, "comm"), []byte(v[0]+"\n"), 0o644)
		if v[1] != "" {
			os.WriteFile(filepath.Join(p, "schedstat"), []byte(v[1]), 0o644)
		}
	}
	os.MkdirAll(filepath.Join(dir, "self"), 0o755)
	return dir
}

func TestFindSumsTheNamedThreads(t *testing.T) {
	proc := fakeProc(t, map[string][2]string{
		"78":  {"kdamond.0", "518699723306 1765677650828 309823\n"},
		"79":  {"kdamond.1", "1000 0 1\n"},
		"100": {"kworker/0:1", "999999999 0 1\n"},
		"101": {"kdamond.2", "garbage\n"},
		"102": {"kdamond.3", ""}, // gone: no schedstat
	})
	th := find(proc, "kdamond")
	if !th.Found() || len(th.stats) != 4 {
		t.Fatalf("found %v", th.stats)
	}
	if got, want := th.CPU(), time.Duration(518699723306+1000); got != want {
		t.Fatalf("CPU %v, want %v", got, want)
	}
}

func TestFindNothing(t *testing.T) {
	th := find(fakeProc(t, map[string][2]string{"5": {"bash", "1 2 3\n"}}), "kdamond")
	if th.Found() || th.CPU() != 0 {
		t.Fatalf("found %v", th.stats)
	}
	if th := find(filepath.Join(t.TempDir(), "missing"), "kdamond"); th.Found() {
		t.Fatal("found threads in a missing /proc")
	}
}

// ReadGBps reads at a plausible speed on a CPU this process may use, and
// refuses no CPUs and a CPU it may not be pinned to.
func TestReadGBps(t *testing.T) {
	cpu, err := FirstCPU()
	if err != nil {
		t.Fatal(err)
	}
	gbps, err := ReadGBps([]int{cpu})
	if err != nil {
		t.Fatal(err)
	}
	// A core reads memory at 1-100 GB/s; 96 MiB in about a second, or in
	// a tenth of a millisecond, is not a read.
	if gbps < 0.1 || gbps > 1000 {
		t.Fatalf("read speed %.2f GB/s", gbps)
	}
	t.Logf("CPU %d reads %.1f GB/s", cpu, gbps)
	if _, err := ReadGBps(nil); err == nil {
		t.Error("no CPUs: no error")
	}
	if _, err := ReadGBps([]int{1 << 20}); err == nil {
		t.Error("a CPU that does not exist: no error")
	}
}

// A probe leaves the thread it ran on alive, unpinned and back in the
// runtime's use: a child whose parent thread ends gets its Pdeathsig (the
// harness's workers die so), and a goroutine that exits locked to its
// thread ends the thread.
func TestReadGBpsKeepsItsThread(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	cpu, err := FirstCPU()
	if err != nil || !set.IsSet(cpu) {
		t.Fatalf("first CPU %d (%v) of %v", cpu, err, set)
	}
	for range 4 {
		if _, tid, err := readOn(cpu); err != nil {
			t.Fatal(err)
		} else if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); err != nil {
			t.Fatalf("the probe's thread %d has ended: %v", tid, err)
		}
	}
	var now unix.CPUSet
	if err := unix.SchedGetaffinity(0, &now); err != nil || now != set {
		t.Fatalf("affinity after the probes: %v (%v), was %v", now, err, set)
	}
}

// SampleCores samples every CPU it was given at every tick, at a plausible
// speed, from threads that outlive it, and leaves the process's affinity
// as it was; it refuses no CPUs and a CPU it may not be pinned to.
func TestSampleCores(t *testing.T) {
	var was unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		t.Fatal(err)
	}
	var cpus []int
	for cpu := range len(was) * 64 {
		if was.IsSet(cpu) && len(cpus) < 2 {
			cpus = append(cpus, cpu)
		}
	}
	s, err := SampleCores(cpus, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	c, err := s.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CPUs %v: %.1f GB/s (%v samples), slowest %.1f over %d windows", c.CPUs, c.GBps, c.Samples, c.Slowest, c.Windows)
	// Samples at 0, 10, ... 200 ms: a loaded CI machine may miss a few;
	// the 200 ms fall in one window of a second.
	if len(c.GBps) != len(cpus) || len(c.Samples) != len(cpus) || slices.Min(c.Samples) < 5 ||
		slices.Max(c.Samples) > 22 || c.Windows != 1 {
		t.Fatalf("%d CPUs sampled, %v samples, %d windows", len(c.GBps), c.Samples, c.Windows)
	}
	// A core copies within its L1 at 1-1000 GB/s.
	for i, g := range c.GBps {
		if g < 1 || g > 1000 {
			t.Fatalf("CPU %d: %.2f GB/s", cpus[i], g)
		}
		if c.Slowest > g*1.0001 {
			t.Fatalf("slowest %.2f above CPU %d's mean %.2f", c.Slowest, cpus[i], g)
		}
	}
	for _, tid := range s.tids {
		if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); err != nil {
			t.Fatalf("a sampling thread %d has ended: %v", tid, err)
		}
	}
	var now unix.CPUSet
	if err := unix.SchedGetaffinity(0, &now); err != nil || now != was {
		t.Fatalf("affinity after sampling: %v (%v), was %v", now, err, was)
	}
	if _, err := SampleCores(nil, time.Millisecond); err == nil {
		t.Error("no CPUs: no error")
	}
	if _, err := SampleCores([]int{cpus[0], 1 << 20}, time.Millisecond); err == nil {
		t.Error("a CPU that does not exist: no error")
	}
}

// Stop's slowest is the mean over the windows every CPU was sampled in of
// the slowest CPU's mean in each.
func TestCoresSlowest(t *testing.T) {
	// Windows of 2 ticks: 0-1, 2-3, 4-5, 6-7.
	s := &CoreSampler{cpus: []int{0, 1}, every: time.Second, window: 2 * time.Second, stop: make(chan struct{}),
		errs:  make([]error, 2),
		ticks: [][]int{{0, 1, 1, 2, 3, 6}, {0, 1, 3, 4}},
		gbps:  [][]float64{{10, 20, 30, 99, 1, 40}, {12, 8, 50, 7}}}
	c, err := s.Stop()
	if err != nil {
		t.Fatal(err)
	}
	// Window 0: CPU 0 (10+20+30)/3 = 20, CPU 1 (12+8)/2 = 10; window 1:
	// CPU 0 (99+1)/2 = 50, CPU 1 50. Windows 2 and 3 have one CPU each.
	if c.Windows != 2 || c.Slowest != (10+50)/2.0 {
		t.Fatalf("slowest %.3f over %d windows", c.Slowest, c.Windows)
	}
	if c.GBps[0] != (10+20+30+99+1+40)/6.0 || c.GBps[1] != (12+8+50+7)/4.0 || !slices.Equal(c.Samples, []int{6, 4}) {
		t.Fatalf("means %v, samples %v", c.GBps, c.Samples)
	}
}

// Steal reads each CPU's steal column in USER_HZ ticks, skips the total
// and lines that are not a CPU's (an empty one too), and refuses a CPU
// /proc/stat does not list.
func TestSteal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	stat := "cpu  5208297 6041 230244 4393890 4755 0 48004 35574 0 0\n" +
		"cpu0 3076916 2103 116302 1722631 2648 0 17990 16859 0 0\n" +
		"cpu1 2131380 3937 113942 2671258 2107 0 30014 18714 0 0\n" +
		"intr 1 2 3\n\nctxt 99\n"
	if err := os.WriteFile(path, []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := stealFrom(path, []int{1, 0})
	if err != nil || len(got) != 2 || got[0] != 187140*time.Millisecond || got[1] != 168590*time.Millisecond {
		t.Fatalf("steal %v (%v)", got, err)
	}
	if _, err := stealFrom(path, []int{2}); err == nil {
		t.Error("cpu2, which the file lacks: no error")
	}
	// The machine's own: every CPU this process may run on is listed.
	cpus, err := AllowedCPUs()
	if err != nil || len(cpus) == 0 {
		t.Fatalf("allowed CPUs %v (%v)", cpus, err)
	}
	if s, err := Steal(cpus); err != nil || len(s) != len(cpus) {
		t.Fatalf("this machine's steal %v (%v)", s, err)
	}
}
