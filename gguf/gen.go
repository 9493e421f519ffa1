package gguf

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/meshnet/shardd/stages/dtype"
)

// Spec describes a generated model.
type Spec struct {
	// Arch is the architecture (default "llama"): any of SupportedArchs.
	Arch                                                string
	Layers, Hidden, Heads, KVHeads, FFN, Vocab, Context int
	// Experts and ExpertsUsed: a mixture-of-experts FFN (qwen3moe) of
	// Experts experts of ExpertFFN each, ExpertsUsed per token.
	Experts, ExpertsUsed, ExpertFFN int
	// Window is the sliding window of gemma3's local layers (0: every
	// layer global); with it, every sixth layer is global and the rest
	// local, with their own RoPE base.
	Window int
	// Weights is "f32", "f16", "bf16" or "q8_0" for the weight matrices; norms are
	// always f32. (k-quants: generate, then quantize with llama.cpp's own
	// quantizer, backend/llamacpp.Quantize, as 'shardd gen-model --weights
	// q4_K_M' does.)
	Weights string
	Seed    uint64
}

// Presets: tiny for tests (a few MB, f32), bench for measuring hops against
// real compute (125M parameters, bf16: a decode step takes milliseconds on 2
// cores). bench's weights are bf16, the dtype most released checkpoints ship
// in and one x86 CPUs with AVX512-BF16 multiply natively (ggml's f16 path
// converts every weight on every use there; PERF.md has both curves). Not
// q8_0: a third of the model would be about 25 MB and fit the 32 MB L3 of
// this project's machines, as no real model's shard does, and batching
// sessions would gain less than on real models.
var Presets = map[string]Spec{
	"tiny":  {Layers: 6, Hidden: 128, Heads: 4, KVHeads: 2, FFN: 256, Vocab: 512, Context: 1024, Weights: "f32", Seed: 1},
	"bench": {Layers: 12, Hidden: 768, Heads: 12, KVHeads: 4, FFN: 2048, Vocab: 32000, Context: 2048, Weights: "bf16", Seed: 1},
}

// ForArch returns s as a model of arch, with what that architecture needs
// of a small model: gemma3 gets 18 layers (three groups of its 6-layer
// local/global pattern, so that 2- and 3-way splits can cut on the
// pattern) and a 64-token window; qwen3moe gets 8 experts of FFN/2, 2 used
// per token.
func (s Spec) ForArch(arch string) Spec {
	s.Arch = arch
	switch arch {
	case "gemma3":
		s.Layers = max(s.Layers, 3*gemma3Pattern)
		s.Layers -= s.Layers % gemma3Pattern
		if s.Window == 0 {
			s.Window = 64
		}
	case "qwen3moe":
		if s.Experts == 0 {
			s.Experts, s.ExpertsUsed, s.ExpertFFN = 8, 2, max(s.FFN/2, 1)
		}
	}
	return s
}

func (s Spec) arch() string {
	if s.Arch == "" {
		return "llama"
	}
	return s.Arch
}

// Validate checks that the dimensions make a loadable model.
func (s Spec) Validate() error {
	switch {
	case !SupportedArchs[s.arch()]:
		return fmt.Errorf("%w %q (supported: %s)", ErrUnsupportedArch, s.arch(), supportedList())
	case s.Layers < 1 || s.Hidden < 1 || s.Heads < 1 || s.KVHeads < 1 || s.FFN < 1 || s.Vocab < 1 || s.Context < 1:
		return fmt.Errorf("gguf: every dimension must be positive: %+v", s)
	case s.Hidden%s.Heads != 0:
		return fmt.Errorf("gguf: hidden %d is not a multiple of heads %d", s.Hidden, s.Heads)
	case s.Heads%s.KVHeads != 0:
		return fmt.Errorf("gguf: heads %d is not a multiple of kv heads %d", s.Heads, s.KVHeads)
	case s.Weights != "f32" && s.Weights != "f16" && s.Weights != "bf16" && s.Weights != "q8_0":
		return fmt.Errorf("gguf: weights must be f32, f16, bf16 or q8_0, not %q", s.Weights)
	case s.Weights == "q8_0" && (s.Hidden%q8Block != 0 || s.FFN%q8Block != 0 || s.ExpertFFN%q8Block != 0):
		return fmt.Errorf("gguf: q8_0 needs hidden and ffn to be multiples of %d", q8Block)
	case s.arch() == "qwen3moe" && (s.Experts < 1 || s.ExpertsUsed < 1 || s.ExpertsUsed > s.Experts || s.ExpertFFN < 1):
		return fmt.Errorf("gguf: qwen3moe needs experts, experts used (at most experts) and an expert FFN size")
	case s.arch() == "gemma3" && s.Window > 0 && s.Layers%gemma3Pattern != 0:
		return fmt.Errorf("gguf: gemma3 with a sliding window needs a multiple of %d layers", gemma3Pattern)
	}
	return nil
}

// Parameters is the model's parameter count.
func (s Spec) Parameters() int64 {
	hd := s.Hidden / s.Heads
	ffn := 3 * s.Hidden * s.FFN
	if s.Experts > 0 {
		ffn = 3*s.Hidden*s.ExpertFFN*s.Experts + s.Hidden*s.Experts
	}
	perLayer := 2*s.Hidden*s.Hidden + 2*s.Hidden*s.KVHeads*hd + ffn + 2*s.Hidden
	head := 2 * s.Hidden * s.Vocab
	if tiedHead[s.arch()] {
		head = s.Hidden * s.Vocab
	}
	return int64(s.Layers*perLayer + head + s.Hidden)
}

// tiedHead: generated models of these architectures have no output.weight
// and compute logits with token_embd, as their small checkpoints do.
var tiedHead = map[string]bool{"qwen2": true, "gemma3": true}

// gemma3Pattern is gemma3's local/global layer pattern with a sliding
// window: layer i is global when i%6 == 5 (llama.cpp's set_swa_pattern(6)).
const gemma3Pattern = 6

// Generate writes the model to path. Weights are drawn from a normal
// distribution with standard deviation 1/sqrt(fan-in), deterministically from
// Seed and each tensor's name, so the same Spec always writes the same bytes.
func Generate(path string, s Spec) error {
	if err := s.Validate(); err != nil {
		return err
	}
	arch := s.arch()
	hd := s.Hidden / s.Heads
	ftype := map[string]uint32{"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}[s.Weights]
	kv := ggml.KV{
		"general.architecture":                     arch,
		"general.name":                             fmt.Sprintf("shardd-random-%s-%dL-%d", arch, s.Layers, s.Hidden),
		"general.file_type":                        ftype,
		arch + ".block_count":                      uint32(s.Layers),
		arch + ".context_length":                   uint32(s.Context),
		arch + ".embedding_length":                 uint32(s.Hidden),
		arch + ".feed_forward_length":              uint32(s.FFN),
		arch + ".attention.head_count":             uint32(s.Heads),
		arch + ".attention.head_count_kv":          uint32(s.KVHeads),
		arch + ".attention.layer_norm_rms_epsilon": float32(1e-5),
		arch + ".rope.freq_base":                   float32(10000),
		arch + ".rope.dimension_count":             uint32(hd),
		arch + ".vocab_size":                       uint32(s.Vocab),
		"tokenizer.ggml.model":                     "none",
	}
	switch arch {
	case "gemma3":
		// Global layers at a base of 1e6, local ones at llama.cpp's fixed
		// 1e4: a split that moved a layer across the pattern would change
		// its RoPE and show.
		kv[arch+".rope.freq_base"] = float32(1e6)
		if s.Window > 0 {
			kv[arch+".attention.sliding_window"] = uint32(s.Window)
		}
		kv[arch+".final_logit_softcapping"] = float32(30)
	case "qwen3moe":
		kv[arch+".expert_count"] = uint32(s.Experts)
		kv[arch+".expert_used_count"] = uint32(s.ExpertsUsed)
		kv[arch+".expert_feed_forward_length"] = uint32(s.ExpertFFN)
	}
	var ts []*ggml.Tensor
	add := func(name string, kind string, shape ...uint64) {
		ts = append(ts, randomTensor(name, kind, s.Seed, shape))
	}
	h, v, kvd, ff, hdu := uint64(s.Hidden), uint64(s.Vocab), uint64(s.KVHeads*hd), uint64(s.FFN), uint64(hd)
	add("token_embd.weight", s.Weights, h, v)
	if !tiedHead[arch] {
		add("output.weight", s.Weights, h, v)
	}
	add("output_norm.weight", "norm", h)
	for i := range s.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		add(p+"attn_norm.weight", "norm", h)
		if arch == "phi3" {
			add(p+"attn_qkv.weight", s.Weights, h, h+2*kvd)
		} else {
			add(p+"attn_q.weight", s.Weights, h, h)
			add(p+"attn_k.weight", s.Weights, h, kvd)
			add(p+"attn_v.weight", s.Weights, h, kvd)
		}
		switch arch {
		case "qwen2":
			add(p+"attn_q.bias", "bias", h)
			add(p+"attn_k.bias", "bias", kvd)
			add(p+"attn_v.bias", "bias", kvd)
		case "qwen3", "qwen3moe", "gemma3":
			add(p+"attn_q_norm.weight", "norm", hdu)
			add(p+"attn_k_norm.weight", "norm", hdu)
		}
		add(p+"attn_output.weight", s.Weights, h, h)
		if arch == "gemma3" {
			add(p+"post_attention_norm.weight", "norm", h)
		}
		add(p+"ffn_norm.weight", "norm", h)
		switch arch {
		case "phi3":
			add(p+"ffn_up.weight", s.Weights, h, 2*ff)
			add(p+"ffn_down.weight", s.Weights, ff, h)
		case "qwen3moe":
			e, ef := uint64(s.Experts), uint64(s.ExpertFFN)
			add(p+"ffn_gate_inp.weight", "f32", h, e)
			add(p+"ffn_gate_exps.weight", s.Weights, h, ef, e)
			add(p+"ffn_up_exps.weight", s.Weights, h, ef, e)
			add(p+"ffn_down_exps.weight", s.Weights, ef, h, e)
		default:
			add(p+"ffn_gate.weight", s.Weights, h, ff)
			add(p+"ffn_up.weight", s.Weights, h, ff)
			add(p+"ffn_down.weight", s.Weights, ff, h)
		}
		if arch == "gemma3" {
			add(p+"post_ffw_norm.weight", "norm", h)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return writeFile(path, kv, ts)
}

// randomTensor returns a tensor whose bytes are generated when written.
// kind "norm" is an f32 vector near 1, "bias" an f32 vector near 0.
func randomTensor(name, kind string, seed uint64, shape []uint64) *ggml.Tensor {
	t := &ggml.Tensor{Name: name, Shape: shape}
	switch kind {
	case "f16":
		t.Kind = uint32(ggml.TensorTypeF16)
	case "bf16":
		t.Kind = uint32(ggml.TensorTypeBF16)
	case "q8_0":
		t.Kind = uint32(ggml.TensorTypeQ8_0)
	default:
		t.Kind = uint32(ggml.TensorTypeF32)
	}
	t.WriterTo = writerFunc(func(w io.Writer) (int64, error) {
		h := fnv.New64a()
		h.Write([]byte(name))
		r := rand.New(rand.NewPCG(seed, h.Sum64()))
		row := int(shape[0])
		rows := 1
		for _, d := range shape[1:] {
			rows *= int(d)
		}
		std := 1 / math.Sqrt(float64(row))
		vals := make([]float32, row)
		var buf []byte
		var n int64
		for range rows {
			for i := range vals {
				switch kind {
				case "norm":
					vals[i] = float32(1 + 0.1*r.NormFloat64())
				case "bias":
					vals[i] = float32(0.1 * r.NormFloat64())
				default:
					vals[i] = float32(std * r.NormFloat64())
				}
			}
			buf = encodeRow(buf[:0], kind, vals)
			m, err := w.Write(buf)
			n += int64(m)
			if err != nil {
				return n, err
			}
		}
		return n, nil
	})
	return t
}

func encodeRow(dst []byte, kind string, vals []float32) []byte {
	switch kind {
	case "f16":
		return dtype.AppendF32ToF16(dst, vals)
	case "bf16":
		return dtype.AppendF32ToBF16(dst, vals)
	case "q8_0":
		return appendQ8_0(dst, vals)
	}
	for _, v := range vals {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
	}
	return dst
}

type writerFunc func(io.Writer) (int64, error)

func (f writerFunc) WriteTo(w io.Writer) (int64, error) { return f(w) }
