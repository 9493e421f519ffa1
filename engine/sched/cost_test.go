package sched

import (
	"testing"
	"time"
)

// The model recovers a linear cost from forwards of mixed sizes, predicts
// from it, and fits the prefill rows that keep a budget.
func TestCostModel(t *testing.T) {
	var m costModel
	if _, ok := m.predict(4); ok {
		t.Fatal("an empty model predicted")
	}
	base, row := 10*time.Millisecond, 2*time.Millisecond
	for i := range 40 {
		rows := []int{1, 4, 16, 128}[i%4]
		m.add(rows, base+time.Duration(rows)*row)
	}
	b, r, ok := m.coef()
	if !ok || b < 0.0099 || b > 0.0101 || r < 0.00199 || r > 0.00201 {
		t.Fatalf("coef = %v s + %v s/row, want 0.010 + 0.002", b, r)
	}
	if p, _ := m.predict(8); p < 25*time.Millisecond || p > 27*time.Millisecond {
		t.Errorf("predict(8) = %v, want 26ms", p)
	}
	// 16 decode rows take 42 ms; a 63 ms budget leaves 21 ms: 10 rows.
	if n := m.fit(16, 63*time.Millisecond); n != 10 && n != 9 {
		t.Errorf("fit(16, 63ms) = %d, want 10", n)
	}
	if n := m.fit(16, 40*time.Millisecond); n != 0 {
		t.Errorf("fit past the budget = %d, want 0", n)
	}
	// Newer forwards outweigh old ones: the machine got twice as slow.
	for range 300 {
		m.add(1, 2*(base+row))
		m.add(64, 2*(base+64*row))
	}
	if p, _ := m.predict(1); p < 23*time.Millisecond || p > 25*time.Millisecond {
		t.Errorf("after the slow-down predict(1) = %v, want 24ms", p)
	}
}

// With one batch size only the model cannot split base from per-row cost
// and charges everything per row.
func TestCostModelOneSize(t *testing.T) {
	var m costModel
	for range 10 {
		m.add(4, 20*time.Millisecond)
	}
	b, r, ok := m.coef()
	if !ok || b != 0 || r < 0.00499 || r > 0.00501 {
		t.Fatalf("coef = %v + %v/row, want 0 + 0.005", b, r)
	}
}
