package route

import (
	"context"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/telemetry"
)

// TestPrefixCacheExact: a two-shard route whose workers keep a prefix cache
// generates, for prompts that share prefixes (a system prompt, a
// conversation's history, the same prompt twice), every token and every
// logit bitwise what a route without the cache generates, at the bf16
// boundary; and the cache did answer prompt positions on both shards.
// Chunks of 40 tokens against blocks of 32: a prefix is found across
// chunk boundaries that are not block boundaries; chunks of 64 are
// answered whole.
func TestPrefixCacheExact(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real workers")
	}
	_, shards := tinySplit(t, gguf.Presets["tiny"].Seed)
	ports := []int{freePort(t), freePort(t)}
	cached := []*proc{
		serve(t, shards[0], "127.0.0.1:0", "--metrics-listen", fmt.Sprint("127.0.0.1:", ports[0])),
		serve(t, shards[1], "127.0.0.1:0", "--metrics-listen", fmt.Sprint("127.0.0.1:", ports[1])),
	}
	plain := []*proc{serve(t, shards[0], "127.0.0.1:0", "--prefix-cache-bytes", "0"), serve(t, shards[1], "127.0.0.1:0", "--prefix-cache-bytes", "0")}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dial := func(p []*proc, chunk int) *Route {
		r, err := Dial(ctx, []string{p[0].addr, p[1].addr}, Options{StepTimeout: 30 * time.Second, PrefillChunk: chunk})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	withCache, without := dial(cached, 40), dial(plain, 40)

	system := seqTokens(1, 100)
	turn1 := append(slices.Clone(system), seqTokens(2, 7)...)
	prompts := [][]int32{
		append(slices.Clone(system), seqTokens(3, 5)...),
		append(slices.Clone(system), seqTokens(4, 40)...),
		turn1,
		append(append(slices.Clone(turn1), seqTokens(5, 9)...), seqTokens(6, 30)...), // the next turn
		append(slices.Clone(system), seqTokens(3, 5)...),                             // the first again
		seqTokens(7, 31), // shorter than a block
	}
	for i, p := range prompts {
		a, aBits := generateBits(ctx, t, withCache, p, 12)
		b, bBits := generateBits(ctx, t, without, p, 12)
		if !slices.Equal(a, b) {
			t.Fatalf("prompt %d: with the prefix cache %v, without %v", i, a, b)
		}
		for k := range aBits {
			if !slices.Equal(aBits[k], bBits[k]) {
				t.Fatalf("prompt %d, token %d: logits with the prefix cache differ from without", i, k)
			}
		}
	}
	// Chunks of 64, on block boundaries: the first shard answers whole
	// chunks from the cache, without a forward.
	before := metric(t, ports[0], "shardd_prefix_hits_total")
	a, aBits := generateBits(ctx, t, dial(cached, 64), prompts[1], 12)
	b, bBits := generateBits(ctx, t, without, prompts[1], 12)
	if !slices.Equal(a, b) || !slices.EqualFunc(aBits, bBits, slices.Equal) {
		t.Fatalf("chunks of 64: with the prefix cache %v, without %v (or their logits differ)", a, b)
	}
	if hits := metric(t, ports[0], "shardd_prefix_hits_total") - before; hits < 2 {
		t.Errorf("chunks of 64: %v chunks from the prefix cache on the first shard, want 2", hits)
	}
	for i, port := range ports {
		if n := metric(t, port, "shardd_prefix_tokens_total"); n < 300 {
			t.Errorf("shard %d: %v prompt positions answered from the prefix cache, want at least 200", i, n)
		}
	}
}

// seqTokens is n token ids drawn from seed (the tiny preset's vocabulary).
func seqTokens(seed, n int) []int32 {
	out := make([]int32, n)
	x := uint32(seed)*2654435761 + 1
	for i := range out {
		x = x*1664525 + 1013904223
		out[i] = int32(x>>16) % 512
	}
	return out
}

// generateBits generates n greedy tokens and the bits of the logits each
// was chosen from.
func generateBits(ctx context.Context, t *testing.T, r *Route, prompt []int32, n int) ([]int32, [][]uint32) {
	t.Helper()
	var got []int32
	var bits [][]uint32
	req := Request{Prompt: prompt, MaxTokens: n, Logits: func(_ int, l []float32) {
		b := make([]uint32, len(l))
		for i, v := range l {
			b[i] = math.Float32bits(v)
		}
		bits = append(bits, b)
	}}
	if _, err := r.Generate(ctx, req, func(tok int32) error { got = append(got, tok); return nil }); err != nil {
		t.Fatal(err)
	}
	return got, bits
}

// freePort is a loopback TCP port free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// metric reads one value from a worker's Prometheus endpoint.
func metric(t *testing.T, port int, name string) float64 {
	t.Helper()
	m, err := telemetry.Scrape(fmt.Sprintf("127.0.0.1:%d", port), name)
	if err != nil {
		t.Fatal(err)
	}
	return m[name]
}

// tinySplit generates the tiny preset with seed in a temporary folder and
// splits it in two; it returns the model and its shards.
func tinySplit(t *testing.T, seed uint64) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	spec := gguf.Presets["tiny"]
	spec.Seed = seed
	model := filepath.Join(dir, "tiny.gguf")
	if err := gguf.Generate(model, spec); err != nil {
		t.Fatal(err)
	}
	shards, err := gguf.Split(model, gguf.EvenRanges(6, 2), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return model, shards
}
