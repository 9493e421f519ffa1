package load

import (
	"strings"
	"testing"
)

// TestRelayHops: a hop list names hops of the route at the harness's
// relay, "all" names every hop, and a hop the route lacks is refused.
func TestRelayHops(t *testing.T) {
	r, err := StartRelay(0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := r.Hops("1", 2)
	if err != nil || len(got) != 1 || got[1] != "relay://"+r.addr+"/hop1" {
		t.Fatalf("1 of 2: %v %v", got, err)
	}
	if got, err = r.Hops("all", 3); err != nil || len(got) != 3 || !strings.HasSuffix(got[2], "/hop2") {
		t.Fatalf("all of 3: %v %v", got, err)
	}
	if got, err = r.Hops("0,,1", 2); err != nil || len(got) != 2 {
		t.Fatalf("0,,1: %v %v", got, err)
	}
	for _, bad := range []string{"2", "-1", "x"} {
		if _, err := r.Hops(bad, 2); err == nil || !strings.Contains(err.Error(), "--relay-hops") {
			t.Errorf("%q: err %v", bad, err)
		}
	}
}

// TestSessionArgs: workers are sized for the most requests in flight at
// any level (64 for an open loop) and the longest request.
func TestSessionArgs(t *testing.T) {
	w := Workload{Concurrency: 4}
	w.Lengths.Prompt, w.Lengths.Output = [2]int{8, 100}, [2]int{16, 16}
	if got := strings.Join(SessionArgs(w, []float64{4, 8}, "concurrency"), " "); got != "--max-sessions 9 --ctx-tokens 1496" {
		t.Fatalf("closed loop: %s", got)
	}
	w.Rate = 2
	if got := strings.Join(SessionArgs(w, []float64{2}, ""), " "); got != "--max-sessions 65 --ctx-tokens 8440" {
		t.Fatalf("open loop: %s", got)
	}
}

// TestSessionArgsPairs: with a lengths file, workers are sized for its
// longest prompt and its longest output, in every turn of a conversation.
func TestSessionArgsPairs(t *testing.T) {
	w := Workload{Concurrency: 2, Turns: 2}
	w.Lengths.Pairs = [][2]int{{10, 50}, {30, 5}}
	// The last turn: 2 messages of up to 30 and an answer of up to 50;
	// then up to 50 more: 160 + 8 a session, 3 sessions and room for one
	// more (a --exact worker's share), + 256.
	if got := strings.Join(SessionArgs(w, []float64{2}, ""), " "); got != "--max-sessions 3 --ctx-tokens 928" {
		t.Fatalf("%s", got)
	}
}
