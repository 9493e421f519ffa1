package llamacpp

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/ollama/ollama/llama"
	"github.com/ollama/ollama/ml"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/gguf"
)

// benchShards returns the bench preset split three ways, cached under the
// system temp folder between runs. SHARDD_BENCH_MODEL names another whole
// model to split instead.
func benchShards(b *testing.B) []string {
	return benchShardsWeights(b, "")
}

// benchShardsWeights is benchShards with the preset's weights generated as
// weights instead ("" keeps the preset's).
func benchShardsWeights(b *testing.B, weights string) []string {
	b.Helper()
	dir := filepath.Join(os.TempDir(), "shardd-bench-models")
	model := os.Getenv("SHARDD_BENCH_MODEL")
	var err error
	if model == "" || weights != "" {
		s := gguf.Presets["bench"]
		if weights != "" {
			s.Weights = weights
		}
		model, err = gguf.CachedSpec(dir, "bench", s)
	}
	if err != nil {
		b.Fatal(err)
	}
	paths, err := gguf.CachedSplit(model, 3, dir)
	if err != nil {
		b.Fatal(err)
	}
	return paths
}

func benchThreads() int { return runtime.NumCPU() }

// BenchmarkDecodeStep: one decode step (1 token, 1 session) on the middle
// shard of the bench preset, shardd's backend against a plain llama.Decode
// through ollama's Go wrapper on the same GGUF with the same threads, in the
// same run. Target: shardd >= 0.97x plain.
func BenchmarkDecodeStep(b *testing.B) {
	path := benchShards(b)[1]
	const ctx = 512
	b.Run("shardd", func(b *testing.B) { batchedDecode(b, path, 1, ctx) })
	b.Run("plain", func(b *testing.B) {
		m, err := llama.LoadModelFromFile(path, llama.ModelParams{UseMmap: true})
		if err != nil {
			b.Fatal(err)
		}
		defer llama.FreeModel(m)
		lc, err := llama.NewContextWithModel(m, llama.NewContextParams(ctx, 1, 1, benchThreads(), ml.FlashAttentionAuto, ""))
		if err != nil {
			b.Fatal(err)
		}
		hidden := m.NEmbd()
		bt, err := llama.NewBatch(1, 1, hidden)
		if err != nil {
			b.Fatal(err)
		}
		defer bt.Free()
		emb := make([]float32, hidden)
		for i := range emb {
			emb[i] = float32(i%61) * 0.001
		}
		pos := 0
		b.ReportAllocs()
		b.SetBytes(int64(2 * hidden))
		for b.Loop() {
			if pos == ctx {
				lc.KvCacheSeqRm(0, 0, -1)
				pos = 0
			}
			bt.Clear()
			bt.Add(0, emb, pos, true, 0)
			if err := lc.Decode(bt); err != nil {
				b.Fatal(err)
			}
			pos++
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
	})
}

// BenchmarkBatchedDecode: N sessions decoded in one call on the middle shard
// of the bench preset (bf16 weights), and of the same model with f16 weights
// for comparison. Reports aggregate tokens/s; PERF.md quotes the curves and
// the 16-session to 1-session ratio (target >= 3x).
func BenchmarkBatchedDecode(b *testing.B) {
	for _, weights := range []string{"bf16", "f16"} {
		b.Run("weights="+weights, func(b *testing.B) {
			path := benchShardsWeights(b, weights)[1]
			for _, n := range []int{1, 2, 4, 8, 16, 32, 64} {
				b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) { batchedDecode(b, path, n, 64) })
			}
		})
	}
}

// batchedDecode decodes n sessions one token each per call on path, each
// session rewound after perSeq tokens.
func batchedDecode(b *testing.B, path string, n, perSeq int) {
	be, err := Open(Config{Path: path, Threads: benchThreads(), MaxSeqs: n, CtxTokens: n * perSeq, MaxBatch: n})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	bt, _ := be.NewBatch()
	defer be.FreeBatch(bt)
	row := make([]byte, 2*be.Info().Hidden)
	for i := range row {
		row[i] = byte(i * 5 % 59)
	}
	var out backend.Output
	pos := 0
	b.ReportAllocs()
	b.SetBytes(int64(n * len(row)))
	for b.Loop() {
		if pos == perSeq {
			for s := range n {
				be.SeqTrim(s, 0)
			}
			pos = 0
		}
		bt.Reset()
		for s := range n {
			bt.AddHiddenBF16(s, pos, row, true)
		}
		if err := be.Forward(bt, &out); err != nil {
			b.Fatal(err)
		}
		pos++
	}
	b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tokens/s")
}
