package engine

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/backend/llamacpp"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/internal/recipe"
)

// TestRecipeKernels: what changes a backend's bits changes the recipe
// digest, and the capability report's recipe lines say which line: a build
// for another instruction set, another library build (a patch), the exact
// mode. Labels that do not change bits (the CPU's model name, the thread
// count) are not in it.
func TestRecipeKernels(t *testing.T) {
	meta := gguf.Meta{Arch: "llama", FileType: "f32"}
	info := backend.Info{Name: "llama.cpp/ollama-v0.17.4 cpu", Device: "cpu:AMD EPYC", Threads: 1,
		Kernels: []string{"build=llama.cpp ollama-v0.17.4 patches=sgemm-any-rows:aa, cc=gcc 12, cflags=-O3 march=znver3 mtune=znver3", "isa=avx avx2 fma f16c avx512"}}
	base := RecipeFor(info, meta, shardv1.DType_DTYPE_BFLOAT16, false)
	other := func(edit func(*backend.Info)) Recipe {
		i := info
		i.Kernels = slices.Clone(info.Kernels)
		edit(&i)
		return RecipeFor(i, meta, shardv1.DType_DTYPE_BFLOAT16, false)
	}
	for name, c := range map[string]struct {
		r    Recipe
		diff string // the line that differs ("" none)
	}{
		"x86-64-v2 build": {other(func(i *backend.Info) { i.Kernels[1] = "isa=sse3 ssse3" }), "isa"},
		"another patch": {other(func(i *backend.Info) {
			i.Kernels[0] = strings.Replace(i.Kernels[0], "sgemm-any-rows:aa", "sgemm-any-rows:bb", 1)
		}), "build"},
		"exact mode":        {RecipeFor(info, meta, shardv1.DType_DTYPE_BFLOAT16, true), "batching"},
		"f32 boundary":      {RecipeFor(info, meta, shardv1.DType_DTYPE_FLOAT32, false), "boundary"},
		"16 threads":        {other(func(i *backend.Info) { i.Threads = 16 }), ""},
		"another CPU model": {other(func(i *backend.Info) { i.Device = "cpu:Intel Xeon" }), ""},
	} {
		diff := recipe.Diff(strings.Join(base.Lines(), recipe.Sep), strings.Join(c.r.Lines(), recipe.Sep))
		if (c.r.Digest() != base.Digest()) != (c.diff != "") {
			t.Errorf("%s: digest %.12s against %.12s", name, c.r.Digest(), base.Digest())
		}
		if c.diff == "" && len(diff) > 0 || c.diff != "" && (len(diff) != 1 || !strings.HasPrefix(diff[0], c.diff+": ")) {
			t.Errorf("%s: lines that differ %q, want the %q line", name, diff, c.diff)
		}
	}
}

// TestRecipeThreads: one shard served at 1 and at 2 threads reports one
// recipe digest and computes the same bits, prefill and decode: the thread
// count splits the work, not the sums.
func TestRecipeThreads(t *testing.T) {
	_, shards := tinyFiles(t)
	meta, err := gguf.Read(shards[0])
	if err != nil {
		t.Fatal(err)
	}
	var digests []string
	var outs [][]float32
	for _, threads := range []int{1, 2} {
		be, err := llamacpp.OpenMeta(llamacpp.Config{Path: shards[0], Threads: threads, MaxSeqs: 2, CtxTokens: 128, MaxBatch: 64}, meta)
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, RecipeFor(be.Info(), meta, shardv1.DType_DTYPE_BFLOAT16, false).Digest())
		b, _ := be.NewBatch()
		var out backend.Output
		var got []float32
		for step, toks := range [][]int32{{3, 14, 15, 92, 65, 35, 89, 79, 32, 38}, {46}, {26}} {
			b.Reset()
			first := []int{0, 10, 11}[step]
			for i, tok := range toks {
				if err := b.AddToken(0, first+i, tok, true); err != nil {
					t.Fatal(err)
				}
			}
			if err := be.Forward(b, &out); err != nil {
				t.Fatal(err)
			}
			got = append(got, out.Hidden...)
		}
		be.FreeBatch(b)
		be.Close()
		outs = append(outs, got)
	}
	if digests[0] != digests[1] {
		t.Fatalf("1 and 2 threads: recipe digests %.12s and %.12s", digests[0], digests[1])
	}
	for i := range outs[0] {
		if math.Float32bits(outs[0][i]) != math.Float32bits(outs[1][i]) {
			t.Fatalf("1 and 2 threads: hidden value %d is %v and %v", i, outs[0][i], outs[1][i])
		}
	}
}

// The prefix cache's seed names the whole identity: another recipe, range,
// model or boundary dtype gives another seed, so its entries never match
// (sched's TestPrefixCacheIdentity: entries under another seed are never
// used).
func TestPrefixSeedIdentity(t *testing.T) {
	id := func(model, recipe string, start, end uint32) Identity {
		return Identity{Fingerprint: &shardv1.Fingerprint{ModelArtifactDigest: model, RuntimeRecipeDigest: recipe},
			Range: &shardv1.ShardRange{StartLayer: start, EndLayer: end}}
	}
	base := prefixSeed(id("sha256:m", "r1", 0, 6), "bf16")
	for name, seed := range map[string][32]byte{
		"recipe":   prefixSeed(id("sha256:m", "r2", 0, 6), "bf16"),
		"range":    prefixSeed(id("sha256:m", "r1", 0, 3), "bf16"),
		"model":    prefixSeed(id("sha256:n", "r1", 0, 6), "bf16"),
		"boundary": prefixSeed(id("sha256:m", "r1", 0, 6), "f32"),
	} {
		if seed == base {
			t.Errorf("another %s gives the same seed", name)
		}
	}
	if prefixSeed(id("sha256:m", "r1", 0, 6), "bf16") != base {
		t.Error("the same identity gives another seed")
	}
}
