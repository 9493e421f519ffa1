package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/engine"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/load"
	"github.com/meshnet/shardd/verify"
)

func init() {
	register(command{name: "gen-model", summary: "write a GGUF of a supported architecture with deterministic random weights", run: runGenModel})
	register(command{name: "split", summary: "cut a whole GGUF into one GGUF per layer range", run: runSplit})
	register(command{name: "inspect", summary: "print a GGUF's architecture, dimensions, range and digest", run: runInspect})
	register(command{name: "verify", summary: "prove that splits compute the whole model's logits", run: runVerify})
}

func runGenModel(args []string) error {
	fs := newFlags("gen-model", "--preset tiny|bench [--arch NAME] --out FILE [flags]",
		"Writes a real GGUF with deterministic random weights, with the metadata and tensor names llama.cpp\n"+
			"expects of its architecture. Dimension flags override the preset's. k-quant weights (--weights q4_K_M,\n"+
			"q6_K, ...) are written by llama.cpp's own quantizer from the f32 model, as llama-quantize would.")
	preset := fs.String("preset", "tiny", "tiny (a few MB, f32) or bench (125M parameters, bf16)")
	arch := fs.String("arch", "llama", "architecture: "+strings.Join(slices.Sorted(maps.Keys(gguf.SupportedArchs)), ", ")+" (gemma3 gets 18 layers and a sliding window, qwen3moe 8 experts)")
	out := fs.String("out", "", "output file")
	seed := fs.Uint64("seed", 0, "weight seed (0: the preset's)")
	layers := fs.Int("layers", 0, "transformer layers")
	hidden := fs.Int("hidden", 0, "hidden size")
	heads := fs.Int("heads", 0, "attention heads")
	kvHeads := fs.Int("kv-heads", 0, "key/value heads")
	ffn := fs.Int("ffn", 0, "feed-forward size")
	vocab := fs.Int("vocab", 0, "vocabulary size")
	ctx := fs.Int("context", 0, "context length")
	weights := fs.String("weights", "", "weight type: f32, f16, bf16 or q8_0, or a llama.cpp quantization: "+strings.Join(llamacpp.QuantTypes(), ", "))
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := required(fs, "out"); err != nil {
		return err
	}
	s, ok := gguf.Presets[*preset]
	if !ok {
		return fmt.Errorf("unknown preset %q (tiny, bench)", *preset)
	}
	for _, o := range []struct {
		dst *int
		v   int
	}{{&s.Layers, *layers}, {&s.Hidden, *hidden}, {&s.Heads, *heads}, {&s.KVHeads, *kvHeads}, {&s.FFN, *ffn}, {&s.Vocab, *vocab}, {&s.Context, *ctx}} {
		if o.v != 0 {
			*o.dst = o.v
		}
	}
	s = s.ForArch(*arch)
	quant := ""
	switch *weights {
	case "":
	case "f32", "f16", "bf16", "q8_0":
		s.Weights = *weights
	default:
		quant, s.Weights = *weights, "f32"
	}
	if *seed != 0 {
		s.Seed = *seed
	}
	start := time.Now()
	if quant == "" {
		if err := gguf.Generate(*out, s); err != nil {
			return err
		}
	} else {
		tmp := *out + ".f32.tmp"
		defer os.Remove(tmp)
		if err := gguf.Generate(tmp, s); err != nil {
			return err
		}
		if err := llamacpp.Quantize(tmp, *out, quant); err != nil {
			return err
		}
		s.Weights = quant
	}
	st, _ := os.Stat(*out)
	fmt.Printf("%s: %s, %d layers, hidden %d, %.1fM parameters, %s, %.1f MB in %s\n", *out, s.Arch, s.Layers, s.Hidden,
		float64(s.Parameters())/1e6, s.Weights, float64(st.Size())/1e6, time.Since(start).Round(time.Millisecond))
	return nil
}

// cutFlags say where a model is cut: at --ranges, or into --shards N
// (--by layers or cost, --kv-cells with cost).
type cutFlags struct {
	rangesFlag *string
	shards     *int
	by         *string
	kvCells    *int
	timeRows   *int
	timeThrds  *int
}

// addCutFlags defines the cut flags on fs, their help prefixed with
// context ("with --model: ", or "").
func addCutFlags(fs *flag.FlagSet, context string) cutFlags {
	return cutFlags{
		rangesFlag: fs.String("ranges", "", context+"comma-separated START:END layer ranges, e.g. 0:8,8:12"),
		shards:     fs.Int("shards", 0, context+"split into N shards instead (see --by)"),
		by: fs.String("by", "layers", "with --shards: 'layers' (near-equal layer counts), 'cost' (near-equal multiply-adds a row, the\n"+
			"output head on the last shard) or 'time' (near-equal time, each matrix's type and shape and each\n"+
			"layer's attention timed on this CPU at --time-rows rows: types differ in speed per multiply-add)"),
		kvCells: fs.Int("kv-cells", 0, "with --by cost or time: also weigh each layer's attention over this many KV cells a decode\n"+
			"row attends: on the CPU one session's full length (e.g. 8 + 64 = 72; the kernel skips other sessions'\n"+
			"cells); where attention walks every cell, the sessions in flight times it (32 x 72 = 2304); 0 weighs\n"+
			"the weights alone"),
		timeRows:  fs.Int("time-rows", 16, "with --by time: rows a timed forward carries (a stage's decode group: the sessions in flight over the stages)"),
		timeThrds: fs.Int("time-threads", 1, "with --by time: threads the timed ops run on (a worker's --threads)"),
	}
}

// ranges is where the flags cut model.
func (c cutFlags) ranges(model string) ([]gguf.Range, error) {
	if *c.kvCells < 0 || (*c.kvCells > 0 && (*c.by == "layers" || *c.shards == 0)) {
		return nil, fmt.Errorf("--kv-cells goes with --shards N --by cost or time, and is 0 or more")
	}
	switch {
	case *c.rangesFlag != "" && *c.shards != 0:
		return nil, fmt.Errorf("give --ranges or --shards, not both")
	case *c.rangesFlag != "":
		return gguf.ParseRanges(*c.rangesFlag)
	case *c.shards <= 0:
		return nil, fmt.Errorf("give --shards N or --ranges")
	}
	meta, err := gguf.Read(model)
	if err != nil {
		return nil, err
	}
	if *c.shards > meta.BlockCount {
		return nil, fmt.Errorf("cannot split %d layers %d ways", meta.BlockCount, *c.shards)
	}
	switch *c.by {
	case "layers":
		return meta.EvenRanges(*c.shards)
	case "cost", "time":
		cost, err := gguf.ReadCost(model)
		if err != nil {
			return nil, err
		}
		if *c.by == "cost" {
			cost = cost.WithKV(*c.kvCells)
		} else if cost, err = llamacpp.TimeCost(model, cost, *c.kvCells, *c.timeRows, *c.timeThrds, timeReps); err != nil {
			return nil, err
		}
		rs := gguf.BalancedRanges(cost, *c.shards)
		if rs == nil {
			return nil, fmt.Errorf("cannot cut %d layers into %d shards that start on multiples of %d", meta.BlockCount, *c.shards, cost.Align)
		}
		return rs, nil
	}
	return nil, fmt.Errorf("--by %q: want layers, cost or time", *c.by)
}

// timeReps is how often --by time runs each op it times (the median
// weighs).
const timeReps = 9

func runSplit(args []string) error {
	fs := newFlags("split", "--model FULL.gguf (--ranges 0:6,6:12 | --shards N [--by cost|time [--kv-cells N]]) [--out-dir DIR]",
		"Writes one GGUF per layer range, named <model>.<start>-<end>.gguf, and prints their paths in order.")
	model := fs.String("model", "", "whole model GGUF")
	cut := addCutFlags(fs, "")
	outDir := fs.String("out-dir", ".", "folder for the shard files")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := required(fs, "model"); err != nil {
		return err
	}
	ranges, err := cut.ranges(*model)
	if err != nil {
		return err
	}
	var last time.Time
	progress := func(done, total int64) {
		if *quiet || (time.Since(last) < 200*time.Millisecond && done < total) {
			return
		}
		last = time.Now()
		fmt.Fprintf(os.Stderr, "\rsplit: %5.1f%% of %.1f MB", 100*float64(done)/float64(max(total, 1)), float64(total)/1e6)
		if done == total {
			fmt.Fprintln(os.Stderr)
		}
	}
	paths, err := gguf.Split(*model, ranges, *outDir, progress)
	if err != nil {
		return err
	}
	for _, p := range paths {
		fmt.Println(p)
	}
	return nil
}

func runInspect(args []string) error {
	fs := newFlags("inspect", "[--kv-cells N] [--time-rows N] FILE.gguf", "Prints the architecture, dimensions, layer range and digests of a model or shard.")
	kvCells := fs.Int("kv-cells", 0, "weigh each layer's attention over this many KV cells too (see split --kv-cells)")
	timeRows := fs.Int("time-rows", 0, "a whole model: also weigh it by time on this CPU, at this many rows a forward (see split --by time)")
	timeThreads := fs.Int("time-threads", 1, "with --time-rows: threads the timed ops run on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("want one file")
	}
	m, err := gguf.Read(fs.Arg(0))
	if err != nil {
		return err
	}
	kind := "whole model"
	if m.IsShard {
		kind = "shard"
	}
	role := "middle (hidden in, hidden out)"
	switch {
	case m.First() && m.Last():
		role = "whole (tokens in, logits out)"
	case m.First():
		role = "first (tokens in, hidden out)"
	case m.Last():
		role = "last (hidden in, logits out)"
	}
	fmt.Printf("file:          %s (%s)\n", m.Path, kind)
	fmt.Printf("architecture:  %s\n", m.Arch)
	fmt.Printf("layers:        %d:%d of %d (%d in this file), role %s\n", m.Start, m.End, m.Total, m.BlockCount, role)
	fmt.Printf("dimensions:    hidden %d, ffn %d, heads %d, kv heads %d, vocab %d, context %d\n",
		m.EmbeddingLen, m.FFNLen, m.HeadCount, m.HeadCountKV, m.VocabSize, m.ContextLen)
	fmt.Printf("weights:       %s\n", m.FileType)
	if m.Align > 1 {
		fmt.Printf("cuts:          a shard starts on a multiple of %d layers (the %s local/global layer pattern)\n", m.Align, m.Arch)
	}
	fmt.Printf("tensors:       %d\n", m.Tensors)
	fmt.Printf("model digest:  sha256:%s\n", m.SourceDigest)
	// The recipe this binary serves the file with on the CPU, at the
	// default bf16 boundary (GetCapability's backend field carries the
	// same lines from a running worker).
	r := engine.RecipeFor(backend.Info{Name: llamacpp.Version + " cpu", Kernels: llamacpp.Kernels()}, m, shardv1.DType_DTYPE_BFLOAT16, false)
	fmt.Printf("recipe digest: sha256:%s (this build, CPU, bf16 boundary)\n", r.Digest())
	for _, l := range r.Lines() {
		fmt.Printf("  %s\n", l)
	}
	c, err := gguf.ReadCost(fs.Arg(0))
	if err != nil {
		return err
	}
	printCost(m, c, *kvCells)
	if *timeRows > 0 && !m.IsShard {
		t, err := llamacpp.TimeCost(fs.Arg(0), c, *kvCells, *timeRows, *timeThreads, timeReps)
		if err != nil {
			return err
		}
		ms := func(ps int64) string { return fmt.Sprintf("%.2f ms", float64(ps)/1e9) }
		fmt.Printf("time:          a forward of %d rows on %d thread(s) %s: layers %s to %s, output head %s\n", *timeRows, *timeThreads,
			ms(t.Total()), ms(slices.Min(t.Layers)), ms(slices.Max(t.Layers)), ms(t.Head))
		for k := 2; k <= min(4, len(t.Layers)); k++ {
			fmt.Printf("%d shards:      by time %s\n", k, shares(t, gguf.BalancedRanges(t, k)))
		}
	}
	return nil
}

// shares lists rs with each range's share of c.
func shares(c gguf.Cost, rs []gguf.Range) string {
	if len(rs) == 0 {
		return "none (the layer pattern allows no such cut)"
	}
	var parts []string
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%s %.0f%%", r, 100*float64(c.Of(r))/float64(c.Total())))
	}
	return strings.Join(parts, ", ")
}

// printCost prints what inspect says about compute: the multiply-adds a
// row (gguf.Cost), with attention over cells KV cells counted in when
// cells > 0, and how splits share them.
func printCost(m gguf.Meta, c gguf.Cost, cells int) {
	mb := func(b int64) string { return fmt.Sprintf("%.1fM", float64(b)/1e6) }
	perLayer := (c.Total() - c.Head) / int64(max(len(c.Layers), 1))
	fmt.Printf("cost:          multiply-adds a row %s: %s per layer, output head %s\n", mb(c.Total()), mb(perLayer), mb(c.Head))
	if cells > 0 {
		w := c.WithKV(cells)
		fmt.Printf("attention:     over %d KV cells, %s per layer (%.0f%% of the layer's weights)\n",
			cells, mb((w.Total()-w.Head)/int64(max(len(w.Layers), 1))-perLayer), 100*float64(w.Total()-c.Total())/float64(max(c.Total()-c.Head, 1)))
		c, perLayer = w, (w.Total()-w.Head)/int64(max(len(w.Layers), 1))
	}
	if m.IsShard {
		// The rest of the model is not here: assume its layers weigh as
		// these do, and a head like the token embedding (vocab x hidden)
		// unless this shard holds it.
		head := c.Head
		if !m.Last() {
			head = int64(m.VocabSize) * int64(m.EmbeddingLen)
		}
		whole := perLayer*int64(m.Total) + head
		fmt.Printf("share:         about %.0f%% of the whole model's (if its other layers weigh as these do)\n", 100*float64(c.Total())/float64(whole))
		return
	}
	for k := 2; k <= min(4, len(c.Layers)); k++ {
		even, _ := gguf.Meta{BlockCount: len(c.Layers), Align: c.Align}.EvenRanges(k)
		fmt.Printf("%d shards:      by layers %s; by cost %s\n", k, shares(c, even), shares(c, gguf.BalancedRanges(c, k)))
	}
}

func runVerify(args []string) error {
	fs := newFlags("verify", "--model FULL.gguf [--shards 2,3]",
		"Runs the whole model and its splits on the same script (prefill, decode steps, two interleaved\nsessions, a mid-sequence rewind) and compares logits bitwise: at an f32 boundary with the whole model,\nat the wire's bf16 boundary with the whole model rounded to bf16 after the same layers. Greedy tokens\nthe rounding flips against the unrounded model are reported with their margin, not failed.")
	model := fs.String("model", "", "whole model GGUF")
	shardsFlag := fs.String("shards", "2,3", "comma-separated shard counts")
	threads := fs.Int("threads", 0, "forward threads (0: all cores)")
	steps := fs.Int("decode", 16, "decode steps")
	gpuLayers := fs.Int("gpu-layers", 0, "put this many layers of every model compared (the whole model's, each shard's) on a GPU, as serve's (-1: all); needs a GPU build (make build-cuda)")
	device := fs.String("device", "", "with --gpu-layers: the GPU, by index or name (CUDA0); default: the first")
	promptFile := fs.String("prompts", "", "also measure, on this JSONL of real prompts (as bench --prompts, e.g. "+load.DefaultPrompts+"), how many of --decode greedy tokens a bf16 route flips against the unrounded whole model, with their margins")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := required(fs, "model"); err != nil {
		return err
	}
	var splits []int
	for _, s := range splitList(*shardsFlag) {
		var n int
		if _, err := fmt.Sscan(s, &n); err != nil {
			return fmt.Errorf("bad --shards %q", *shardsFlag)
		}
		splits = append(splits, n)
	}
	results, err := verify.Run(verify.Config{Model: *model, Splits: splits, Threads: *threads, Decode: *steps,
		GPULayers: *gpuLayers, Device: *device, Log: func(f string, a ...any) { fmt.Printf(f+"\n", a...) }})
	if err != nil {
		return err
	}
	for _, r := range results {
		if !r.Identical {
			ref := "the whole model"
			if r.Boundary == verify.BF16 {
				ref = "the whole model rounded at the same boundaries"
			}
			return fmt.Errorf("%d-way split differs from %s at a %s boundary, from logit row %d on (max |diff| %.3g)",
				r.Shards, ref, r.Boundary, r.FirstDiff, r.MaxDiff)
		}
	}
	fmt.Println("verify: every split is bitwise equal to its reference (f32: the whole model; bf16: the whole model rounded to bf16 where the route rounds)")
	if *promptFile == "" {
		return nil
	}
	prompts, err := tokenizePromptFile(*promptFile, *model)
	if err != nil {
		return err
	}
	for _, n := range splits {
		f, err := verify.MeasureFlips(*model, n, prompts, *steps, *threads)
		if err != nil {
			return err
		}
		fmt.Println("flips:", f)
	}
	return nil
}
