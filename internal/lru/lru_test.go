package lru

import (
	"slices"
	"testing"
)

func TestStrictRecencyAndBudget(t *testing.T) {
	var evicted []string
	c := New[string, int](3, func(k string, _ int) { evicted = append(evicted, k) })
	c.Put("a", 1, 1)
	c.Put("b", 2, 1)
	c.Put("c", 3, 1)
	c.Get("a") // a is now newest; b is oldest
	c.Put("d", 4, 1)
	if !slices.Equal(evicted, []string{"b"}) {
		t.Fatalf("evicted %v, want [b]", evicted)
	}
	c.Put("e", 5, 2) // needs two units: c then a go
	if !slices.Equal(evicted, []string{"b", "c", "a"}) {
		t.Fatalf("evicted %v", evicted)
	}
	if c.Len() != 2 || c.Cost() != 3 {
		t.Fatalf("len %d cost %d", c.Len(), c.Cost())
	}
	if _, ok := c.Peek("d"); !ok {
		t.Fatal("d missing")
	}
	if v, ok := c.Remove("d"); !ok || v != 4 || len(evicted) != 3 {
		t.Fatal("Remove must not call onEvict")
	}
	c.Put("e", 6, 1) // replace: old value evicted through the callback
	if evicted[len(evicted)-1] != "e" || c.Cost() != 1 {
		t.Fatalf("replace: %v cost %d", evicted, c.Cost())
	}
	k, _, _ := c.Oldest()
	if k != "e" {
		t.Fatalf("oldest %s", k)
	}
	c.Put("huge", 0, 10) // costlier than the budget: evicted at once, with everything else
	if c.Len() != 0 {
		t.Fatalf("len %d", c.Len())
	}
}

// A cache whose size holds steady, one entry in and one out (the results
// of a decoding session, step after step), allocates nothing: removed
// nodes are reused.
func TestSteadyPutRemoveAllocatesNothing(t *testing.T) {
	type key struct {
		s    string
		step uint64
	}
	c := New[key, *int](0, nil)
	v := new(int)
	const keep = 8
	step := uint64(0)
	for ; step < keep; step++ {
		c.Put(key{"a", step}, v, 1)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		c.Put(key{"a", step}, v, 1)
		if _, ok := c.Remove(key{"a", step - keep}); !ok {
			t.Fatal("oldest step missing")
		}
		step++
	})
	if allocs != 0 {
		t.Fatalf("%.2f allocations per put and remove", allocs)
	}
	if c.Len() != keep {
		t.Fatalf("len %d", c.Len())
	}
	var seen []uint64
	c.All(func(k key, _ *int) bool { seen = append(seen, k.step); return true })
	for i := 1; i < len(seen); i++ {
		if seen[i] != seen[i-1]-1 {
			t.Fatalf("order %v, want newest first", seen)
		}
	}
}
