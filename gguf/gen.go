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

// Spec describes a generated llama-architecture model.
type Spec struct {
	Layers, Hidden, Heads, KVHeads, FFN, Vocab, Context int
	// Weights is "f32", "f16", "bf16" or "q8_0" for the weight matrices; norms are
	// always f32.
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

// Validate checks that the dimensions make a loadable model.
func (s Spec) Validate() error {
	switch {
	case s.Layers < 1 || s.Hidden < 1 || s.Heads < 1 || s.KVHeads < 1 || s.FFN < 1 || s.Vocab < 1 || s.Context < 1:
		return fmt.Errorf("gguf: every dimension must be positive: %+v", s)
	case s.Hidden%s.Heads != 0:
		return fmt.Errorf("gguf: hidden %d is not a multiple of heads %d", s.Hidden, s.Heads)
	case s.Heads%s.KVHeads != 0:
		return fmt.Errorf("gguf: heads %d is not a multiple of kv heads %d", s.Heads, s.KVHeads)
	case s.Weights != "f32" && s.Weights != "f16" && s.Weights != "bf16" && s.Weights != "q8_0":
		return fmt.Errorf("gguf: weights must be f32, f16, bf16 or q8_0, not %q", s.Weights)
	case s.Weights == "q8_0" && (s.Hidden%q8Block != 0 || s.FFN%q8Block != 0):
		return fmt.Errorf("gguf: q8_0 needs hidden and ffn to be multiples of %d", q8Block)
	}
	return nil
}

// Parameters is the model's parameter count.
func (s Spec) Parameters() int64 {
	hd := s.Hidden / s.Heads
	perLayer := 2*s.Hidden*s.Hidden + 2*s.Hidden*s.KVHeads*hd + 3*s.Hidden*s.FFN + 2*s.Hidden
	return int64(s.Layers*perLayer + 2*s.Hidden*s.Vocab + s.Hidden)
}

// Generate writes the model to path. Weights are drawn from a normal
// distribution with standard deviation 1/sqrt(fan-in), deterministically from
// Seed and each tensor's name, so the same Spec always writes the same bytes.
func Generate(path string, s Spec) error {
	if err := s.Validate(); err != nil {
		return err
	}
	hd := s.Hidden / s.Heads
	ftype := map[string]uint32{"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}[s.Weights]
	kv := ggml.KV{
		"general.architecture":                   "llama",
		"general.name":                           fmt.Sprintf("shardd-random-%dL-%d", s.Layers, s.Hidden),
		"general.file_type":                      ftype,
		"llama.block_count":                      uint32(s.Layers),
		"llama.context_length":                   uint32(s.Context),
		"llama.embedding_length":                 uint32(s.Hidden),
		"llama.feed_forward_length":              uint32(s.FFN),
		"llama.attention.head_count":             uint32(s.Heads),
		"llama.attention.head_count_kv":          uint32(s.KVHeads),
		"llama.attention.layer_norm_rms_epsilon": float32(1e-5),
		"llama.rope.freq_base":                   float32(10000),
		"llama.rope.dimension_count":             uint32(hd),
		"llama.vocab_size":                       uint32(s.Vocab),
		"tokenizer.ggml.model":                   "none",
	}
	var ts []*ggml.Tensor
	add := func(name string, kind string, shape ...uint64) {
		ts = append(ts, randomTensor(name, kind, s.Seed, shape))
	}
	h, v, kvd, ff := uint64(s.Hidden), uint64(s.Vocab), uint64(s.KVHeads*hd), uint64(s.FFN)
	add("token_embd.weight", s.Weights, h, v)
	add("output.weight", s.Weights, h, v)
	add("output_norm.weight", "norm", h)
	for i := range s.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		add(p+"attn_norm.weight", "norm", h)
		add(p+"attn_q.weight", s.Weights, h, h)
		add(p+"attn_k.weight", s.Weights, h, kvd)
		add(p+"attn_v.weight", s.Weights, h, kvd)
		add(p+"attn_output.weight", s.Weights, h, h)
		add(p+"ffn_norm.weight", "norm", h)
		add(p+"ffn_gate.weight", s.Weights, h, ff)
		add(p+"ffn_up.weight", s.Weights, h, ff)
		add(p+"ffn_down.weight", s.Weights, ff, h)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return writeFile(path, kv, ts)
}

// randomTensor returns a tensor whose bytes are generated when written.
// kind "norm" is an f32 vector near 1.
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
				if kind == "norm" {
					vals[i] = float32(1 + 0.1*r.NormFloat64())
				} else {
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
