package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"

	"github.com/meshnet/shardd/backend"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/internal/wireerr"
)

// Recipe is everything that changes the numbers a worker computes. Two
// workers whose recipes differ never share a runtime_recipe_digest, so they
// refuse each other at open instead of producing silently different tokens.
type Recipe struct {
	Backend string // backend and version, e.g. "llama.cpp/0c1e57098 cpu"
	// Kernels name what chooses the backend's kernels and their rounding
	// (backend.Info.Kernels): its build (library version, patches,
	// compilers, flags, target) and the instruction set ggml's kernels
	// were compiled for. Not the thread count (the forward's bits do not
	// depend on it: TestRecipeThreads) nor the CPU's model name.
	Kernels  []string
	Weights  string // weight types of the file
	KVType   string // KV cache element type
	Boundary string // activation dtype on the wire: bf16 (canonical) or f32
	// TailNorm is where the shard boundary sits relative to the final norm:
	// shardd passes the residual stream after the last block, before
	// output_norm, which only the last shard applies.
	TailNorm string
	Arch     string
	// Exact: each session with a KV stream of its own and every
	// operation of the forward batch-invariant (Config.Exact), so
	// its numbers do not depend on what else runs. (The recipe line says
	// "batching=per-session", as it did when forwards carried one
	// session's rows: the numbers are the same, and so is the digest.)
	Exact bool
}

// Canonical is the digested form: one key=value per line, fixed order.
func (r Recipe) Canonical() string {
	return strings.Join(r.Lines(), "\n")
}

// Lines are the recipe's key=value lines, in the digested order: what
// GetCapability's backend field shows, so a person can read why two
// digests differ (Diff).
func (r Recipe) Lines() []string {
	lines := []string{"recipe=shardd/2", "backend=" + r.Backend}
	lines = append(lines, r.Kernels...)
	lines = append(lines,
		"arch="+r.Arch,
		"weights="+r.Weights,
		"kv="+r.KVType,
		"boundary="+r.Boundary,
		"tail_norm="+r.TailNorm,
	)
	if b := r.batching(); b != "" {
		lines = append(lines, b)
	}
	return lines
}

// batching is the recipe line of the exact mode (none otherwise).
func (r Recipe) batching() string {
	if r.Exact {
		return "batching=per-session,kv=per-session"
	}
	return ""
}

// Digest is the hex SHA-256 of Canonical.
func (r Recipe) Digest() string {
	sum := sha256.Sum256([]byte(r.Canonical()))
	return hex.EncodeToString(sum[:])
}

// RecipeFor returns the recipe of a backend serving meta with the given
// boundary dtype.
func RecipeFor(info backend.Info, meta gguf.Meta, boundary shardv1.DType, exact bool) Recipe {
	b := "bf16"
	if boundary == shardv1.DType_DTYPE_FLOAT32 {
		b = "f32"
	}
	return Recipe{
		Backend:  info.Name,
		Kernels:  info.Kernels,
		Weights:  meta.FileType,
		KVType:   "f16",
		Boundary: b,
		TailNorm: "residual-before-output-norm",
		Arch:     meta.Arch,

		Exact: exact,
	}
}

// Identity is what this worker serves.
type Identity struct {
	Fingerprint *shardv1.Fingerprint
	Range       *shardv1.ShardRange
}

// NewIdentity builds the served identity.
func NewIdentity(meta gguf.Meta, recipe Recipe, version string) Identity {
	return Identity{
		Fingerprint: &shardv1.Fingerprint{
			ModelArtifactDigest: "sha256:" + meta.SourceDigest,
			RuntimeRecipeDigest: "sha256:" + recipe.Digest(),
			RecipeId:            "shardd-" + meta.Arch + "-" + recipe.Boundary,
			RecipeVersion:       version,
			CatalogueVersion:    "",
		},
		Range: &shardv1.ShardRange{StartLayer: uint32(meta.Start), EndLayer: uint32(meta.End), EffectiveStartLayer: uint32(meta.Start)},
	}
}

// checkFingerprint compares digests, never labels.
func (id Identity) checkFingerprint(fp *shardv1.Fingerprint) error {
	if fp == nil {
		return wireerr.Errorf(ErrFingerprint, "no fingerprint")
	}
	if fp.ModelArtifactDigest != id.Fingerprint.ModelArtifactDigest {
		return wireerr.Errorf(ErrFingerprint, "model artifact digest differs")
	}
	if fp.RuntimeRecipeDigest != id.Fingerprint.RuntimeRecipeDigest {
		return wireerr.Errorf(ErrFingerprint, "runtime recipe digest differs")
	}
	return nil
}

// checkRange accepts exactly the served range. The worker executes
// [effective_start_layer, end_layer); its GGUF holds [start, end), so it can
// honour only effective_start_layer == start_layer: starting later would need
// layers skipped, starting earlier layers it does not hold.
func (id Identity) checkRange(r *shardv1.ShardRange) error {
	want := id.Range
	if r == nil {
		return wireerr.Errorf(ErrRange, "no shard range")
	}
	if r.StartLayer != want.StartLayer || r.EndLayer != want.EndLayer {
		return wireerr.Errorf(ErrRange, "asked %d:%d, serving %d:%d", r.StartLayer, r.EndLayer, want.StartLayer, want.EndLayer)
	}
	if r.EffectiveStartLayer != want.StartLayer {
		return wireerr.Errorf(ErrEffectiveStart, "effective start %d, this shard starts at %d", r.EffectiveStartLayer, want.StartLayer)
	}
	return nil
}

// prefixSeed is the prefix cache's chain start for a worker serving id
// with the given boundary dtype: entries of another identity never match.
func prefixSeed(id Identity, boundary string) [32]byte {
	h := sha256.New()
	fp, r := id.Fingerprint, id.Range
	for _, s := range []string{"shardd prefix/1", fp.GetModelArtifactDigest(), fp.GetRuntimeRecipeDigest(), boundary} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	var b [8]byte
	binary.LittleEndian.PutUint32(b[:4], r.GetStartLayer())
	binary.LittleEndian.PutUint32(b[4:], r.GetEndLayer())
	h.Write(b[:])
	var seed [32]byte
	h.Sum(seed[:0])
	return seed
}
