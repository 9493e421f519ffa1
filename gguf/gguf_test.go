package gguf

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ollama/ollama/fs/ggml"
)

func tinyModel(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := Generate(p, Presets["tiny"]); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestGenerateIsDeterministic(t *testing.T) {
	a, b := tinyModel(t), tinyModel(t)
	da, _ := FileDigest(a)
	db, _ := FileDigest(b)
	if da != db {
		t.Fatal("the same spec wrote different bytes")
	}
	s := Presets["tiny"]
	s.Seed = 2
	c := filepath.Join(t.TempDir(), "c.gguf")
	if err := Generate(c, s); err != nil {
		t.Fatal(err)
	}
	if dc, _ := FileDigest(c); dc == da {
		t.Fatal("another seed wrote the same bytes")
	}
}

func TestGenerateQuantized(t *testing.T) {
	for _, w := range []string{"f16", "bf16", "q8_0"} {
		s := Presets["tiny"]
		s.Weights = w
		p := filepath.Join(t.TempDir(), w+".gguf")
		if err := Generate(p, s); err != nil {
			t.Fatal(err)
		}
		m, err := Read(p)
		if err != nil || m.BlockCount != s.Layers {
			t.Fatalf("%s: %+v %v", w, m, err)
		}
	}
	if err := (Spec{Layers: 1, Hidden: 100, Heads: 3, KVHeads: 1, FFN: 8, Vocab: 8, Context: 8, Weights: "f32"}).Validate(); err == nil {
		t.Fatal("hidden not divisible by heads accepted")
	}
}

func TestSplitMetadata(t *testing.T) {
	src := tinyModel(t)
	whole, err := Read(src)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	paths, err := Split(src, EvenRanges(6, 3), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantNames := []string{"tiny.0-2.gguf", "tiny.2-4.gguf", "tiny.4-6.gguf"}
	for i, p := range paths {
		if filepath.Base(p) != wantNames[i] {
			t.Fatalf("path %d = %s, want %s", i, p, wantNames[i])
		}
		m, err := Read(p)
		if err != nil {
			t.Fatal(err)
		}
		if !m.IsShard || m.SourceDigest != whole.SourceDigest || m.Start != 2*i || m.End != 2*i+2 || m.Total != 6 || m.BlockCount != 2 {
			t.Fatalf("shard %d metadata: %+v", i, m)
		}
		if m.First() != (i == 0) || m.Last() != (i == 2) {
			t.Fatalf("shard %d role wrong", i)
		}
		if i == 1 && m.VocabSize != 1 {
			t.Fatalf("middle shard keeps vocab %d", m.VocabSize)
		}
	}
	if _, err := Split(paths[0], EvenRanges(2, 2), dir, nil); err == nil {
		t.Fatal("splitting a shard again was accepted")
	}
	if _, err := Split(src, []Range{{4, 9}}, dir, nil); err == nil {
		t.Fatal("a range past the last layer was accepted")
	}
}

func TestParseRanges(t *testing.T) {
	rs, err := ParseRanges("0:6, 6:12")
	if err != nil || len(rs) != 2 || rs[1] != (Range{6, 12}) {
		t.Fatalf("%v %v", rs, err)
	}
	for _, bad := range []string{"", "0-6", "a:b", "3"} {
		if _, err := ParseRanges(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// rewrite copies src to dst with edit applied to its metadata.
func rewrite(t *testing.T, src, dst string, edit func(ggml.KV)) {
	t.Helper()
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, -1)
	if err != nil {
		t.Fatal(err)
	}
	kv := ggml.KV{}
	for k, v := range g.KV() {
		if kv[k], err = convertValue(v); err != nil {
			t.Fatal(err)
		}
	}
	edit(kv)
	ts := g.Tensors()
	var out []*ggml.Tensor
	for _, x := range ts.Items() {
		out = append(out, &ggml.Tensor{Name: x.Name, Kind: x.Kind, Shape: x.Shape,
			WriterTo: &sectionWriter{r: io.NewSectionReader(f, int64(ts.Offset+x.Offset), int64(x.Size()))}})
	}
	if err := writeFile(dst, kv, out); err != nil {
		t.Fatal(err)
	}
}

// Bad files fail at Read with a classified error, before llama.cpp sees them.
func TestReadRefusesBadFiles(t *testing.T) {
	src := tinyModel(t)
	dir := t.TempDir()
	shards, err := Split(src, EvenRanges(6, 2), dir, nil)
	if err != nil {
		t.Fatal(err)
	}

	truncated := filepath.Join(dir, "truncated.gguf")
	data, _ := os.ReadFile(src)
	os.WriteFile(truncated, data[:len(data)/2], 0o644)
	headerOnly := filepath.Join(dir, "header.gguf")
	os.WriteFile(headerOnly, data[:20], 0o644)
	notGGUF := filepath.Join(dir, "text.gguf")
	os.WriteFile(notGGUF, []byte("this is not a model"), 0o644)

	gemma := filepath.Join(dir, "gemma.gguf")
	rewrite(t, src, gemma, func(kv ggml.KV) { kv["general.architecture"] = "gemma" })
	badRange := filepath.Join(dir, "badrange.gguf")
	rewrite(t, shards[1], badRange, func(kv ggml.KV) { kv[KeyEndLayer] = uint32(5) })
	badDigest := filepath.Join(dir, "baddigest.gguf")
	rewrite(t, shards[0], badDigest, func(kv ggml.KV) { kv[KeySourceDigest] = "abc" })
	pastTotal := filepath.Join(dir, "pasttotal.gguf")
	rewrite(t, shards[1], pastTotal, func(kv ggml.KV) { kv[KeyTotalLayers] = uint32(4) })

	tests := []struct {
		path string
		want error
	}{
		{truncated, ErrBadFile},
		{headerOnly, ErrBadFile},
		{notGGUF, ErrBadFile},
		{filepath.Join(dir, "missing.gguf"), ErrBadFile},
		{gemma, ErrUnsupportedArch},
		{badRange, ErrBadMetadata},
		{badDigest, ErrBadMetadata},
		{pastTotal, ErrBadMetadata},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.path), func(t *testing.T) {
			if _, err := Read(tt.path); !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
}

// Cost-balanced cuts: the largest shard's cost is the smallest any cut
// gives, found by trying them all; the head weighs on the last shard.
func TestBalancedRanges(t *testing.T) {
	cases := []struct {
		layers []int64
		head   int64
		k      int
		want   string
	}{
		{[]int64{10, 10, 10, 10, 10, 10}, 0, 2, "0:3,3:6"},
		{[]int64{10, 10, 10, 10, 10, 10}, 20, 2, "0:4,4:6"},
		{[]int64{10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10}, 35, 2, "0:8,8:12"},
		{[]int64{5, 5, 5, 50, 5, 5}, 0, 3, "0:3,3:4,4:6"},
		{[]int64{10, 10, 10}, 100, 3, "0:1,1:2,2:3"},
	}
	for _, c := range cases {
		got := BalancedRanges(Cost{Layers: c.layers, Head: c.head}, c.k)
		var s []string
		for _, r := range got {
			s = append(s, r.String())
		}
		if strings.Join(s, ",") != c.want {
			t.Errorf("%v head %d in %d: %v, want %s", c.layers, c.head, c.k, s, c.want)
		}
	}
}

// tinyCost generates the tiny preset and reads its cost.
func tinyCost(t *testing.T) (string, Spec, Cost) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tiny.gguf")
	spec := Presets["tiny"]
	if err := Generate(p, spec); err != nil {
		t.Fatal(err)
	}
	c, err := ReadCost(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, spec, c
}

// ReadCost counts each block's matrices and the output head, not the
// embedding lookup or the norms.
func TestReadCost(t *testing.T) {
	p, spec, c := tinyCost(t)
	if len(c.Layers) != spec.Layers || c.Head == 0 {
		t.Fatalf("%d layers, head %d", len(c.Layers), c.Head)
	}
	for i, l := range c.Layers {
		if l != c.Layers[0] || l == 0 {
			t.Fatalf("layer %d: %d bytes, layer 0: %d", i, l, c.Layers[0])
		}
	}
	// Shards: the head only on the last; the first's embedding is a lookup.
	paths, err := Split(p, []Range{{0, 2}, {2, 6}}, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	first, err1 := ReadCost(paths[0])
	last, err2 := ReadCost(paths[1])
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if first.Head != 0 || first.Total() != 2*c.Layers[0] || last.Head != c.Head || last.Total() != c.Of(Range{2, 6}) {
		t.Fatalf("shard costs %+v and %+v of %+v", first, last, c)
	}
}

// The cost is multiply-adds, not bytes: the same shapes at f16 and at
// q8_0 (about half the bytes) cost the same, so a head stored at more
// bits than the layers does not pull the cut toward the front.
func TestCostIsMultiplyAdds(t *testing.T) {
	var costs []Cost
	for _, w := range []string{"f16", "q8_0"} {
		s := Presets["tiny"]
		s.Weights = w
		p := filepath.Join(t.TempDir(), w+".gguf")
		if err := Generate(p, s); err != nil {
			t.Fatal(err)
		}
		c, err := ReadCost(p)
		if err != nil {
			t.Fatal(err)
		}
		costs = append(costs, c)
	}
	if a, b := costs[0], costs[1]; !slices.Equal(a.Layers, b.Layers) || a.Head != b.Head || !slices.Equal(a.PerCell, b.PerCell) {
		t.Fatalf("f16 %+v, q8_0 %+v", a, b)
	}
	s := Presets["tiny"]
	if costs[0].Head != int64(s.Vocab*s.Hidden) {
		t.Fatalf("head %d, want vocab x hidden = %d", costs[0].Head, s.Vocab*s.Hidden)
	}
}

// gemma3 with a sliding window has a local/global layer pattern of 6,
// which the pinned library decides from each layer's index in the whole
// model (gemma3-shard-pattern.patch reads KeyStartLayer): a shard may
// start on any layer. Here the cuts are planned and written off the
// pattern; verify's TestArchitectures splits the generated gemma3 at 9
// and proves the logits bitwise equal to the whole model's (without the
// patch a cut off the pattern changed them by up to 0.23).
func TestGemma3CutsAnywhere(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "gemma3.gguf")
	if err := Generate(model, Presets["tiny"].ForArch("gemma3")); err != nil {
		t.Fatal(err)
	}
	meta, err := Read(model)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Arch != "gemma3" || meta.Align != 1 || meta.BlockCount != 18 {
		t.Fatalf("meta %+v", meta)
	}
	for k, want := range map[int]string{2: "[0:9 9:18]", 4: "[0:4 4:9 9:13 13:18]"} {
		rs, err := meta.EvenRanges(k)
		if err != nil || fmt.Sprint(rs) != want {
			t.Errorf("%d shards: %v %v, want %s", k, rs, err, want)
		}
	}
	paths, err := Split(model, []Range{{0, 3}, {3, 18}}, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := Read(paths[1]); err != nil || m.Align != 1 || m.Start != 3 || m.BlockCount != 15 {
		t.Fatalf("shard %+v %v", m, err)
	}
}

// Every architecture's generated model reads back as itself, with the
// dimensions asked for; an unsupported one is refused, naming the
// supported ones.
func TestGenerateArchitectures(t *testing.T) {
	dir := t.TempDir()
	for arch := range SupportedArchs {
		p := filepath.Join(dir, arch+".gguf")
		s := Presets["tiny"].ForArch(arch)
		if err := Generate(p, s); err != nil {
			t.Fatal(err)
		}
		m, err := Read(p)
		if err != nil || m.Arch != arch || m.BlockCount != s.Layers || m.EmbeddingLen != s.Hidden || m.VocabSize != s.Vocab {
			t.Fatalf("%s: %+v %v", arch, m, err)
		}
	}
	err := Generate(filepath.Join(dir, "x.gguf"), Presets["tiny"].ForArch("gemma2"))
	if !errors.Is(err, ErrUnsupportedArch) || !strings.Contains(err.Error(), "qwen3moe") {
		t.Fatalf("gemma2: %v", err)
	}
}

// Every shard names the whole model's weight types, which the runtime
// recipe digests: a middle shard's f32 placeholder embedding must not
// make its recipe differ from its neighbours' (a route refuses hops whose
// recipes differ; a 3-shard bf16 route was refused so).
func TestShardsNameTheModelsWeights(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "bf16.gguf")
	s := Presets["tiny"]
	s.Weights = "bf16"
	if err := Generate(model, s); err != nil {
		t.Fatal(err)
	}
	whole, err := Read(model)
	if err != nil {
		t.Fatal(err)
	}
	paths, err := Split(model, EvenRanges(6, 3), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		m, err := Read(p)
		if err != nil || m.FileType != whole.FileType {
			t.Fatalf("%s: weights %q, the model's %q (%v)", filepath.Base(p), m.FileType, whole.FileType, err)
		}
	}
}

// Attention work per KV cell: heads x (key + value length) multiply-adds,
// added to every layer and not the head, so with enough cells the
// cost-balanced cut moves a layer off the first shard: the bench preset's
// 0:8 / 8:12 at one session's 72 cells (what a row attends on the CPU,
// where the others' cells are skipped) becomes 0:7 / 7:12 at 32 x 72 (a
// row walking the whole cache). In BenchmarkRoutePipeline's in-process
// pipeline (Intel, 12-06) 0:8 made 1.72-1.74x the whole model's tokens/s
// and 0:7 1.54-1.65x.
func TestCostWithKV(t *testing.T) {
	p, spec, c := tinyCost(t)
	meta, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Layers[0] != layerWeights(spec) {
		t.Fatalf("layer 0: %d multiply-adds a row, want its %d weights", c.Layers[0], layerWeights(spec))
	}
	headDim := int64(meta.EmbeddingLen / meta.HeadCount)
	want := int64(meta.HeadCount) * 2 * headDim
	if len(c.PerCell) != len(c.Layers) || c.PerCell[0] != want {
		t.Fatalf("per cell %v, want %d for each of %d layers", c.PerCell, want, len(c.Layers))
	}
	k := c.WithKV(1000)
	if k.Head != c.Head || k.Layers[0] != c.Layers[0]+1000*want || c.Layers[0] == k.Layers[0] {
		t.Fatalf("with 1000 cells: %+v from %+v", k, c)
	}
	if c.WithKV(0).Total() != c.Total() {
		t.Fatalf("with no cells the cost changed")
	}

	bench := Cost{Layers: slices.Repeat([]int64{6_300_000}, 12), Head: 24_600_000, PerCell: slices.Repeat([]int64{1536}, 12)}
	for cells, want := range map[int]string{0: "[0:8 8:12]", 72: "[0:8 8:12]", 32 * 72: "[0:7 7:12]"} {
		if got := fmt.Sprint(BalancedRanges(bench.WithKV(cells), 2)); got != want {
			t.Errorf("bench preset at %d cells: %s, want %s", cells, got, want)
		}
	}
}

// layerWeights is how many weights one block of spec's model multiplies by.
func layerWeights(s Spec) int64 {
	h, kv, f := int64(s.Hidden), int64(s.Hidden/s.Heads*s.KVHeads), int64(s.FFN)
	return h*h*2 + h*kv*2 + h*f*3
}
