package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/meshnet/shardd/gguf"
)

// `split --by cost --kv-cells N` cuts where the cost with attention over N
// cells balances, which is not where the weights alone do once N is large
// enough; --kv-cells by layers or at --ranges is refused.
func TestSplitByCostWithKVCells(t *testing.T) {
	model, _ := wideHeadTiny(t)
	c, err := gguf.ReadCost(model)
	if err != nil {
		t.Fatal(err)
	}
	var plain []gguf.Range
	cells, shards := 0, 0
	for k := 2; k <= 4 && cells == 0; k++ {
		plain = gguf.BalancedRanges(c, k)
		for n := 64; n <= 1<<20 && cells == 0; n *= 2 {
			if !slices.Equal(gguf.BalancedRanges(c.WithKV(n), k), plain) {
				cells, shards = n, k
			}
		}
	}
	if cells == 0 {
		t.Fatalf("no cell count moves the tiny model's cuts (cost %+v)", c)
	}
	want := gguf.BalancedRanges(c.WithKV(cells), shards)
	out := t.TempDir()
	if err := runSplit([]string{"--model", model, "--shards", fmt.Sprint(shards), "--by", "cost", "--kv-cells", fmt.Sprint(cells), "--out-dir", out, "--quiet"}); err != nil {
		t.Fatal(err)
	}
	for _, r := range want {
		if _, err := gguf.Read(gguf.ShardPath(model, out, r)); err != nil {
			t.Errorf("at %d cells the cut is %v (weights alone: %v), but shard %s: %v", cells, want, plain, r, err)
		}
	}
	matches, _ := filepath.Glob(filepath.Join(out, "*.gguf"))
	if len(matches) != len(want) {
		t.Errorf("%d files for %d shards: %v", len(matches), len(want), matches)
	}
	for _, args := range [][]string{
		{"--model", model, "--shards", "2", "--kv-cells", "100", "--out-dir", out},
		{"--model", model, "--ranges", "0:2,2:6", "--kv-cells", "100", "--out-dir", out},
		{"--model", model, "--shards", "2", "--by", "cost", "--kv-cells", "-1", "--out-dir", out},
	} {
		if err := runSplit(args); err == nil {
			t.Errorf("split %v: no error", args)
		}
	}
}

// `split --by time` cuts where this CPU's times balance, with or without
// --kv-cells: two shards that cover the layers in order.
func TestSplitByTime(t *testing.T) {
	model, spec := wideHeadTiny(t)
	for _, cells := range []string{"0", "72"} {
		out := t.TempDir()
		if err := runSplit([]string{"--model", model, "--shards", "2", "--by", "time", "--kv-cells", cells, "--time-rows", "8", "--out-dir", out, "--quiet"}); err != nil {
			t.Fatal(err)
		}
		matches, _ := filepath.Glob(filepath.Join(out, "*.gguf"))
		slices.Sort(matches)
		next := 0
		for _, m := range matches {
			meta, err := gguf.Read(m)
			if err != nil {
				t.Fatal(err)
			}
			if meta.Start != next {
				t.Errorf("kv cells %s: shard %s starts at %d, want %d", cells, m, meta.Start, next)
			}
			next = meta.End
		}
		if len(matches) != 2 || next != spec.Layers {
			t.Errorf("kv cells %s: %d shards ending at %d: %v", cells, len(matches), next, matches)
		}
	}
}

// wideHeadTiny generates the tiny preset with a vocabulary 8 times as
// large: an output head that outweighs three layers, so the weights alone
// leave the last shard fewer layers.
func wideHeadTiny(t *testing.T) (string, gguf.Spec) {
	spec := gguf.Presets["tiny"]
	spec.Vocab *= 8
	model := filepath.Join(t.TempDir(), "tiny-wide-head.gguf")
	if err := gguf.Generate(model, spec); err != nil {
		t.Fatal(err)
	}
	return model, spec
}
