package hoststat

import (
	"fmt"
	"os"
	"path/filepath"
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
