package hoststat

import (
	"os"
	"path/filepath"
	"testing"
	"time"
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
