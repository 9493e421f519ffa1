package hoststat

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Steal is how long each of cpus has waited for the host while it had
// something to run, so far: /proc/stat's steal column (what the
// hypervisor reports). On a VM a vCPU that halts when idle gives its
// physical CPU to another guest, and its next wakeup may wait for it
// back: a pipeline's hops, idle between forwards many times a second, pay
// that where a model kept busy does not (PERF.md, noise; serve
// --idle-poll).
func Steal(cpus []int) ([]time.Duration, error) { return stealFrom("/proc/stat", cpus) }

// userHz is /proc/stat's unit: USER_HZ, 100 on every Linux architecture
// that matters here.
const userHz = 100

func stealFrom(path string, cpus []int) ([]time.Duration, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ticks := map[int]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 9 {
			continue // not a CPU's line with a steal column
		}
		name, ok := strings.CutPrefix(fields[0], "cpu")
		cpu, err := strconv.Atoi(name)
		if !ok || err != nil {
			continue // the total line, or not a CPU's
		}
		// user nice system idle iowait irq softirq steal ...
		if ticks[cpu], err = strconv.ParseInt(fields[8], 10, 64); err != nil {
			return nil, fmt.Errorf("hoststat: %s: cpu%d: %w", path, cpu, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out := make([]time.Duration, len(cpus))
	for i, cpu := range cpus {
		n, ok := ticks[cpu]
		if !ok {
			return nil, fmt.Errorf("hoststat: %s has no cpu%d", path, cpu)
		}
		out[i] = time.Duration(n) * time.Second / userHz
	}
	return out, nil
}
