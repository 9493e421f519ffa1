package gguf

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/ollama/ollama/fs/ggml"
)

// Cost is a model's forward work by layer, in multiply-adds a row: the
// weights of the matrices each layer multiplies by. A cut only matters
// when the stages overlap, with many sessions in flight (one stream's
// token takes every stage in turn, wherever the cut falls), and a forward
// of many rows is bound by its multiply-adds, not by streaming the weights
// once: weighed by bytes, SmolLM2's Q8_0 output head counted as 14 of its
// Q4_1 layers instead of 8, and the cut it gave (0:22 / 22:30) ran 32
// requests at 0.75x the tokens/s of 0:16 / 16:30 (PERF.md, "The front
// door"). The token embedding is a row lookup and costs nothing here; the
// output head (output.weight, or the token embedding when the model ties
// them) belongs to the last shard.
type Cost struct {
	Layers []int64 // matmul weights of each block, by layer
	Head   int64   // the output head's weights
	// PerCell is each layer's attention work for one KV cell a row
	// attends over: heads x (key + value length) multiply-adds. WithKV
	// adds it in.
	PerCell []int64
	// Align is Meta.Align: cuts fall on multiples of it. (A
	// mixture-of-experts layer counts every expert, though a step reads
	// only those its tokens are routed to.)
	Align int
	// Heads (each layer's query heads) and HeadDim (the longer of a
	// head's key and value) shape a layer's attention, for timing it.
	Heads   []int
	HeadDim int
}

// Timed is c weighed by time instead of multiply-adds: layer i costs
// layer(i), the head head, in whatever unit those are (split --by time:
// picoseconds a forward, measured on this CPU). Multiply-adds misweigh
// matrices of different types and sizes: on the Intel host SmolLM2's
// Q8_0 output head took 5.1-5.4 of its Q4_1 layers' time, not the 8 its
// multiply-adds say, so its cut by cost (0:19) left the first hop the
// bottleneck (PERF.md, "Pipeline"). The result has no PerCell: layer(i)
// carries the layer's attention.
func (c Cost) Timed(layer func(i int) int64, head int64) Cost {
	out := Cost{Layers: make([]int64, len(c.Layers)), Head: head, Align: c.Align, Heads: c.Heads, HeadDim: c.HeadDim}
	for i := range out.Layers {
		out.Layers[i] = layer(i)
	}
	return out
}

// Total is the whole model's cost.
func (c Cost) Total() int64 {
	t := c.Head
	for _, l := range c.Layers {
		t += l
	}
	return t
}

// Of is range r's cost (the head included when r ends at the last layer).
func (c Cost) Of(r Range) int64 {
	var t int64
	for _, l := range c.Layers[r.Start:r.End] {
		t += l
	}
	if r.End == len(c.Layers) {
		t += c.Head
	}
	return t
}

// WithKV is c with each layer's attention over cells KV cells added: the
// work a decode row does beside the weights, which falls on every layer
// but not on the head, so with enough cells a cut balanced on weights
// alone leaves the first shards heavier. cells is what one row attends
// over. In llama.cpp's unified KV cache a row's view spans every session's
// cells, masked; on the CPU, shardd's flash attention skips the cells
// hidden from a row 32 at a time (cpu-fa-skip-hidden.patch), so a row
// costs about its own session's cells: pass one session's length (8 + 64
// = 72), not the cache's (32 x 72), which moved the cost-balanced cuts of
// the bench preset and SmolLM2 a layer or two early (PERF.md, "Pipeline").
// Where attention walks the whole view (a backend without that patch),
// pass the sessions in flight times their length. Sliding-window layers
// are counted as attending over every cell.
func (c Cost) WithKV(cells int) Cost {
	out := c
	out.Layers = slices.Clone(c.Layers)
	for i := range out.Layers {
		if i < len(c.PerCell) {
			out.Layers[i] += c.PerCell[i] * int64(max(cells, 0))
		}
	}
	return out
}

// ReadCost reads a whole model's cost from its tensor table.
func ReadCost(path string) (Cost, error) {
	f, err := os.Open(path)
	if err != nil {
		return Cost{}, fmt.Errorf("%w: %v", ErrBadFile, err)
	}
	defer f.Close()
	g, err := ggml.Decode(f, 0)
	if err != nil {
		return Cost{}, fmt.Errorf("%w: %v", ErrBadFile, err)
	}
	c := Cost{Layers: make([]int64, g.KV().BlockCount()), Align: layerAlign(g.KV().Architecture(), int(g.KV().Uint("attention.sliding_window")))}
	var embd int64
	tied := true
	for _, t := range g.Tensors().Items() {
		if len(t.Shape) < 2 {
			continue // norms and biases: vector work
		}
		switch {
		case t.Name == "output.weight":
			c.Head, tied = int64(t.Elements()), false
		case t.Name == "token_embd.weight":
			embd = int64(t.Elements())
		case strings.HasPrefix(t.Name, "blk."):
			rest := strings.TrimPrefix(t.Name, "blk.")
			n, err := strconv.Atoi(rest[:max(strings.IndexByte(rest, '.'), 0)])
			if err == nil && n >= 0 && n < len(c.Layers) {
				c.Layers[n] += int64(t.Elements())
			}
		}
	}
	kv := g.KV()
	heads := kv.HeadCount()
	kvLen := int64(kv.EmbeddingHeadCountK() + kv.EmbeddingHeadCountV()) // key + value length
	c.HeadDim = int(max(kv.EmbeddingHeadCountK(), kv.EmbeddingHeadCountV()))
	c.PerCell, c.Heads = make([]int64, len(c.Layers)), make([]int, len(c.Layers))
	for i := range c.PerCell {
		if c.Layers[i] > 0 && i < len(heads) {
			c.PerCell[i], c.Heads[i] = int64(heads[i])*kvLen, int(heads[i])
		}
	}
	shardNotLast := kv.String(KeySourceDigest) != "" && kv.Uint(KeyEndLayer) != kv.Uint(KeyTotalLayers)
	if tied && !shardNotLast {
		c.Head = embd // the model ties its output head to the embedding
	}
	return c, nil
}

// BalancedRanges cuts the layers into k contiguous ranges whose largest
// cost is as small as possible (the last range carries the head). Ties go
// to the cut with more layers early.
func BalancedRanges(c Cost, k int) []Range {
	n := len(c.Layers)
	if k <= 0 || k > n {
		return nil
	}
	prefix := make([]int64, n+1)
	for i, l := range c.Layers {
		prefix[i+1] = prefix[i] + l
	}
	cost := func(a, b int) int64 {
		t := prefix[b] - prefix[a]
		if b == n {
			t += c.Head
		}
		return t
	}
	// best[j][i]: the smallest largest cost of layers [0, i) in j ranges;
	// cut[j][i]: where the last of them starts.
	const inf = int64(1) << 62
	best := make([][]int64, k+1)
	cut := make([][]int, k+1)
	for j := range best {
		best[j], cut[j] = make([]int64, n+1), make([]int, n+1)
		for i := range best[j] {
			best[j][i] = inf
		}
	}
	best[0][0] = 0
	for j := 1; j <= k; j++ {
		for i := j; i <= n; i++ {
			for s := i - 1; s >= j-1; s-- {
				if best[j-1][s] == inf || s%max(c.Align, 1) != 0 {
					continue
				}
				if v := max(best[j-1][s], cost(s, i)); v < best[j][i] {
					best[j][i], cut[j][i] = v, s
				}
			}
		}
	}
	if best[k][n] == inf {
		return nil
	}
	out := make([]Range, k)
	for j, i := k, n; j > 0; j-- {
		s := cut[j][i]
		out[j-1] = Range{s, i}
		i = s
	}
	return out
}
