package gguf

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/ollama/ollama/fs/ggml"
)

// Errors a caller can classify.
var (
	ErrUnsupportedArch = errors.New("gguf: unsupported architecture")
	ErrBadFile         = errors.New("gguf: not a readable GGUF file")
	ErrBadMetadata     = errors.New("gguf: shard metadata is inconsistent")
)

// SupportedArchs are the architectures Split and the backend handle: those
// whose llama.cpp graph tags the residual "l_out-<i>", takes injected input
// states as they are, and keeps no state across layers but the residual and
// each layer's own KV. Each was proven bitwise against its whole model at
// an f32 boundary (verify's tests). Their quirks, and where they are met:
//   - llama: Llama 1-3, Mistral 7B, TinyLlama and most llama-family
//     checkpoints.
//   - qwen2 (Qwen2, Qwen2.5): Q/K/V biases; often a tied head (no
//     output.weight: the last shard keeps token_embd).
//   - qwen3: per-head Q/K norms. qwen3moe: the same attention and a
//     mixture-of-experts FFN (router ffn_gate_inp and 3-D expert tensors,
//     all in the block, so they split with it).
//   - phi3 (Phi-3, Phi-4): fused QKV and gate/up tensors; RoPE factor
//     tensors, when present, are global and go to every shard.
//   - gemma3: embeddings scaled by sqrt(n_embd) only for token input
//     (llama.cpp skips the scale for injected states, as a middle shard
//     needs); post-attention and post-FFN norms; a final logit softcap; and
//     a local/global layer pattern of period 6, which llama.cpp decides by
//     the layer's index in its file: the pinned library is patched
//     (scripts/llama-patches/gemma3-shard-pattern.patch) to count from the
//     shard's first layer in the whole model (KeyStartLayer), so a shard
//     may start on any layer. gemma2 is not supported: its graph scales
//     injected states too, which no shard could undo exactly.
var SupportedArchs = map[string]bool{"llama": true, "qwen2": true, "qwen3": true, "qwen3moe": true, "phi3": true, "gemma3": true}

// layerAlign is Meta.Align for an architecture and its sliding window: 1
// for every supported one. (Gemma 3's was its pattern of 6 until the
// library learnt a shard's first layer.)
func layerAlign(arch string, window int) int {
	return 1
}

// EvenRanges cuts the model into k ranges of near-equal layer counts that
// start on multiples of Align (the last range takes what is left).
func (m Meta) EvenRanges(k int) ([]Range, error) {
	a := max(m.Align, 1)
	units := m.BlockCount / a
	if k < 1 || k > units {
		return nil, fmt.Errorf("gguf: %d layers cannot make %d shards that each start on a multiple of %d", m.BlockCount, k, a)
	}
	rs := EvenRanges(units, k)
	for i := range rs {
		rs[i].Start *= a
		rs[i].End *= a
	}
	rs[k-1].End = m.BlockCount
	return rs, nil
}

// CheckAlign refuses a range that does not start on a multiple of Align.
func (m Meta) CheckAlign(rs []Range) error {
	for _, r := range rs {
		if a := max(m.Align, 1); r.Start%a != 0 {
			return fmt.Errorf("gguf: range %s: %s layers follow a %d-layer local/global pattern set by their index in the file, so a shard must start on a multiple of %d", r, m.Arch, a, a)
		}
	}
	return nil
}

// supportedList names SupportedArchs in order, for messages.
func supportedList() string { return strings.Join(slices.Sorted(maps.Keys(SupportedArchs)), ", ") }

// Meta describes a model or shard file.
type Meta struct {
	Path         string
	Arch         string
	BlockCount   int // blocks in this file
	EmbeddingLen int
	FFNLen       int
	HeadCount    int
	HeadCountKV  int
	VocabSize    int
	ContextLen   int
	// FileType names the weight types: the whole model's (a shard says
	// which in its metadata), part of the runtime recipe.
	FileType string
	Tensors  int
	// Align is the layer multiple every shard must start on (1 for most
	// architectures; 6 for gemma3 with a sliding window, whose layers'
	// local/global pattern follows their index in the file).
	Align int
	// Tokenizer is tokenizer.ggml.model: "none" when the file carries no
	// vocabulary (generated models, middle shards).
	Tokenizer string
	// Name is general.name ("" when the file has none).
	Name string

	// The range this file holds within its source model, [Start, End) of
	// Total layers. A file without shardd metadata is a whole model:
	// Start 0, End = Total = BlockCount.
	Start, End, Total int
	// SourceDigest is the SHA-256 of the whole model the shard was cut from
	// (for a whole model, of the file itself): the model_artifact_digest.
	SourceDigest string
	IsShard      bool
}

// First reports whether the file takes token ids (it starts at layer 0).
func (m Meta) First() bool { return m.Start == 0 }

// Last reports whether the file produces logits (it ends at the last layer).
func (m Meta) Last() bool { return m.End == m.Total }

// Read decodes path's header and checks that it is a supported model or a
// consistent shard. It hashes a whole (unsplit) model file to find its
// digest; a shard carries its source digest.
func Read(path string) (Meta, error) {
	f, err := os.Open(path)
	if err != nil {
		return Meta{}, fmt.Errorf("%w: %v", ErrBadFile, err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, 0)
	if err != nil {
		return Meta{}, fmt.Errorf("%w: %v", ErrBadFile, err)
	}
	kv := g.KV()
	m := Meta{
		Path:         path,
		Arch:         kv.Architecture(),
		BlockCount:   int(kv.BlockCount()),
		EmbeddingLen: int(kv.EmbeddingLength()),
		HeadCount:    int(kv.HeadCountMax()),
		HeadCountKV:  int(kv.HeadCountKVMax()),
		ContextLen:   int(kv.ContextLength()),
		FileType:     weightTypes(g.Tensors().Items()),
		Tensors:      len(g.Tensors().Items()),
		Tokenizer:    kv.String("tokenizer.ggml.model"),
		Name:         kv.String("general.name"),
	}
	if ff := kv.FFNLength(); len(ff) > 0 {
		m.FFNLen = int(ff[0])
	}
	m.Align = layerAlign(m.Arch, int(kv.Uint("attention.sliding_window")))
	m.VocabSize = int(kv.Uint("vocab_size"))
	if m.VocabSize == 0 {
		// Real files often carry no <arch>.vocab_size; the token table's
		// length is the vocabulary (the decoder keeps only its length).
		m.VocabSize = arrayLen(kv["tokenizer.ggml.tokens"])
	}
	if !SupportedArchs[m.Arch] {
		return m, fmt.Errorf("%w %q (supported: %s)", ErrUnsupportedArch, m.Arch, supportedList())
	}
	if err := checkSize(f, g); err != nil {
		return m, err
	}

	if digest := kv.String(KeySourceDigest); digest != "" {
		m.IsShard = true
		m.SourceDigest = digest
		m.Start = int(kv.Uint(KeyStartLayer))
		m.End = int(kv.Uint(KeyEndLayer))
		m.Total = int(kv.Uint(KeyTotalLayers))
		if w := kv.String(KeySourceWeights); w != "" {
			// The model's, not this file's: a middle shard's placeholder
			// embedding is f32 whatever the weights are.
			m.FileType = w
		}
		if m.End <= m.Start || m.End > m.Total || m.End-m.Start != m.BlockCount || len(digest) != 64 {
			return m, fmt.Errorf("%w: range %d:%d of %d with %d blocks", ErrBadMetadata, m.Start, m.End, m.Total, m.BlockCount)
		}
		return m, nil
	}
	m.Start, m.End, m.Total = 0, m.BlockCount, m.BlockCount
	if m.SourceDigest, err = FileDigest(path); err != nil {
		return m, err
	}
	return m, nil
}

// arrayLen is the length of a GGUF array value as the decoder returns it
// (*array[T], whose values it drops past its size limit but whose size it
// keeps), or 0 for anything else.
func arrayLen(v any) int {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return 0
	}
	if n := rv.Elem().FieldByName("size"); n.IsValid() && n.CanInt() {
		return int(n.Int())
	}
	return 0
}

// weightTypes names the element types of the weight matrices, e.g. "f16"
// or "q4_K+q6_K", sorted: part of what the runtime recipe digests.
func weightTypes(ts []*ggml.Tensor) string {
	seen := map[string]bool{}
	for _, t := range ts {
		if len(t.Shape) >= 2 {
			seen[strings.ToLower(ggml.TensorType(t.Kind).String())] = true
		}
	}
	return strings.Join(slices.Sorted(maps.Keys(seen)), "+")
}

// checkSize refuses a file shorter than its tensor table says (a truncated
// download or copy), which llama.cpp would otherwise fault on when mapped.
func checkSize(f *os.File, g *ggml.GGML) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadFile, err)
	}
	ts := g.Tensors()
	var end uint64
	for _, t := range ts.Items() {
		end = max(end, ts.Offset+t.Offset+t.Size())
	}
	if uint64(st.Size()) < end {
		return fmt.Errorf("%w: truncated (%d of %d bytes)", ErrBadFile, st.Size(), end)
	}
	return nil
}

// FileDigest returns the hex SHA-256 of a file.
func FileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
