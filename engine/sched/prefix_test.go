package sched

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"
)

// prefixOf feeds tokens to a fresh chain of session id in c.
func prefixOf(c *prefixCache, id string, tokens []int32) *Chain {
	ch := c.chain(id, 0)
	var b []byte
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	c.feed(ch, b, 4)
	return ch
}

func testTokens(n, salt int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32((i*31 + salt) % 500)
	}
	return t
}

// An entry is found again by the same inputs, in whole blocks, at any
// depth up to its own; an entry made under another seed (the engine's
// seed names the identity: recipe, range, model, boundary dtype; its
// TestPrefixSeedIdentity) is never used, even for the same bytes.
func TestPrefixCacheIdentity(t *testing.T) {
	c := newPrefixCache(1<<20, 8, 0, 1024, [32]byte{1})
	tokens := testTokens(30, 1) // 3 whole blocks of 8
	ch := prefixOf(c, "a", tokens)
	if blocks := c.wants(ch); blocks != 3 {
		t.Fatalf("wants %d blocks, want 3", blocks)
	}
	c.insert(ch, 3, []byte("state"))
	if c.wants(prefixOf(c, "a2", tokens)) != 0 {
		t.Fatal("the same prefix is wanted again")
	}
	// The same prompt, a longer one, and one that differs in block 2.
	if e, end := c.match(prefixOf(c, "b", tokens), 0, 30); e == nil || end != 24 {
		t.Fatalf("same prompt: end %d", end)
	}
	if e, end := c.match(prefixOf(c, "c", append(testTokens(30, 1), testTokens(50, 2)...)), 8, 80); e == nil || end != 24 {
		t.Fatalf("longer prompt from position 8: end %d", end)
	}
	other := testTokens(30, 1)
	other[12]++
	if _, end := c.match(prefixOf(c, "d", other), 0, 30); end != 8 {
		t.Fatalf("a prompt that differs in block 2 matched to %d, want 8", end)
	}
	foreign := *c // the same entries, chains keyed from another seed
	foreign.seed, foreign.chains = [32]byte{2}, map[string]*Chain{}
	if e, _ := foreign.match(prefixOf(&foreign, "x", tokens), 0, 30); e != nil {
		t.Error("another seed used this seed's entry")
	}
}

// Entries are bounded in bytes, least recently used out first, and an
// evicted entry's blocks are found no more; on a hidden-state shard an
// entry keeps its blocks' output rows.
func TestPrefixCacheBounded(t *testing.T) {
	const row = 4
	c := newPrefixCache(3*(100+8*row+32), 8, row, 1024, [32]byte{1})
	var chains []*Chain
	for i := range 5 {
		ch := prefixOf(c, "s", testTokens(8, 10+i))
		out := bytes.Repeat([]byte{byte(i)}, 8*row)
		c.keep(ch, 0, out)
		if c.wants(ch) != 1 {
			t.Fatalf("entry %d not wanted", i)
		}
		c.insert(ch, 1, make([]byte, 100))
		chains = append(chains, &Chain{keys: append([][32]byte(nil), ch.keys...), valid: true})
	}
	if got := c.entries.Cost(); got > 3*(100+8*row+32) {
		t.Fatalf("%d bytes held", got)
	}
	for i, ch := range chains {
		e, _ := c.match(ch, 0, 8)
		if (e != nil) != (i >= 2) {
			t.Fatalf("entry %d found %v after eviction", i, e != nil)
		}
		if e != nil && !bytes.Equal(e.out, bytes.Repeat([]byte{byte(i)}, 8*row)) {
			t.Fatalf("entry %d: outputs %v", i, e.out)
		}
	}
	if len(c.index) != 3 {
		t.Fatalf("%d keys indexed, want 3", len(c.index))
	}

	// Two entries share a first block; the one its key points to goes, and
	// the block is found in the other.
	c = newPrefixCache(2*(100+16*row+64), 8, row, 1024, [32]byte{2})
	shared := testTokens(8, 1)
	for i := range 2 {
		ch := prefixOf(c, "s", append(slices.Clone(shared), testTokens(8, 20+i)...))
		c.keep(ch, 0, make([]byte, 16*row))
		c.insert(ch, 2, make([]byte, 100))
	}
	// The second entry used last: the first, which the shared key points
	// to, is the least recently used.
	if e, end := c.match(prefixOf(c, "x", append(slices.Clone(shared), testTokens(8, 21)...)), 0, 16); e == nil || end != 16 {
		t.Fatal("second entry not found")
	}
	ch := prefixOf(c, "s", testTokens(16, 30)) // a third entry evicts the least recently used
	c.keep(ch, 0, make([]byte, 16*row))
	c.insert(ch, 2, make([]byte, 100))
	if c.entries.Len() != 2 {
		t.Fatalf("%d entries, want 2", c.entries.Len())
	}
	if e, end := c.match(prefixOf(c, "y", shared), 0, 8); e == nil || end != 8 {
		t.Fatal("the shared block was lost with one of the entries holding it")
	}
}
