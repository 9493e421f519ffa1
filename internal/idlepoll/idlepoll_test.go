package idlepoll

import (
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A Poller's threads run pinned at SCHED_IDLE, spin for the window after
// an Extend and no longer, and end at Stop; it refuses no CPUs, no window
// and a CPU it may not be pinned to.
func TestPoller(t *testing.T) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	cpu := 0
	for !set.IsSet(cpu) {
		cpu++
	}
	const window = 30 * time.Millisecond
	p, err := Start([]int{cpu}, window)
	if err != nil {
		t.Fatal(err)
	}
	tid := p.tids()[0]
	attr, err := unix.SchedGetAttr(tid, 0)
	if err != nil || attr.Policy != unix.SCHED_IDLE {
		t.Fatalf("thread %d: policy %+v (%v), want SCHED_IDLE", tid, attr, err)
	}
	var on unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &on); err != nil || on.Count() != 1 || !on.IsSet(cpu) {
		t.Fatalf("thread %d on %v (%v), want CPU %d alone", tid, on, err, cpu)
	}
	if s := p.Spun(); s != 0 {
		t.Fatalf("spun %v before any Extend", s)
	}
	// Each Extend adds at most the window of CPU time. A loaded machine
	// may leave the thread, at the lowest priority, none of a window, so
	// a few more are allowed before it must have spun.
	most := window + 2*time.Millisecond
	extends := 0
	for ; extends < 20 && p.Spun() == 0; extends++ {
		p.Extend()
		time.Sleep(3 * window)
	}
	spun := p.Spun()
	t.Logf("spun %v of %d windows of %v", spun, extends, window)
	if spun <= 0 || spun > time.Duration(extends)*most {
		t.Fatalf("spun %v after %d Extends of %v", spun, extends, window)
	}
	// Past the window it stops: four windows on, the total is still
	// within the Extends' windows (CPU time a starved thread spun and had
	// not counted may come in late, never more).
	time.Sleep(4 * window)
	if s := p.Spun(); s > time.Duration(extends)*most {
		t.Fatalf("spun %v, then %v: the thread went on past its window", spun, s)
	}
	p.Stop()
	if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); err == nil {
		t.Fatalf("thread %d still runs after Stop", tid)
	}
	if _, err := Start(nil, window); err == nil {
		t.Error("no CPUs: no error")
	}
	if _, err := Start([]int{cpu}, 0); err == nil {
		t.Error("no window: no error")
	}
	if _, err := Start([]int{cpu, 1 << 12}, window); err == nil {
		t.Error("a CPU that does not exist: no error")
	}
	var nilPoller *Poller
	nilPoller.Extend()
	nilPoller.Stop()
	if nilPoller.Spun() != 0 {
		t.Error("a nil Poller spun")
	}
}
