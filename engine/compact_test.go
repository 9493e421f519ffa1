package engine

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/argmax"
	"github.com/meshnet/shardd/internal/tensorname"
	"github.com/meshnet/shardd/stages"
	"github.com/meshnet/shardd/stages/checksum"
	"github.com/meshnet/shardd/stages/frameout"
	"github.com/meshnet/shardd/stages/reassemble"
	"github.com/meshnet/shardd/stages/receive"
)

// topKTensor frames a logits_top_k request for k.
func (s *session) topKTensor(k int32) *shardv1.NamedTensor { return s.scalar(tensorname.LogitsTopK, k) }

// scalar frames a tensor holding one INT32.
func (s *session) scalar(name string, v int32) *shardv1.NamedTensor {
	nt := &shardv1.NamedTensor{}
	s.framer.Frame(nt, name, []int64{1}, shardv1.DType_DTYPE_INT32, binary.LittleEndian.AppendUint32(nil, uint32(v)), frameout.Options{})
	return nt
}

// payload reads a response tensor's bytes (tiled, checked, decompressed).
func payload(t *testing.T, nt *shardv1.NamedTensor) []byte {
	t.Helper()
	p := receive.New(receive.Config{Budget: reassemble.Budget{MaxTensorBytes: 64 << 20}, Checksum: checksum.Policy{Require: true}}, bufpool.Default)
	defer p.Close()
	var tt stages.Tensor
	defer tt.Reset()
	if err := p.Tensor(&tt, nt, true); err != nil {
		t.Fatalf("%s: %v", nt.Name, err)
	}
	return slices.Clone(tt.Contiguous(bufpool.Default))
}

// TestCompactOutput: a unit of work that carries logits_top_k gets, for
// each output row, the K best logits and their ids, best first, exactly
// those of the whole row the same work gets without it; prefill (two
// output positions) and a decode step sent as a chunk. A shard without
// logits, and a K outside 1..maxTopK, are refused.
func TestCompactOutput(t *testing.T) {
	whole, shards := tinyFiles(t)
	w := startLlama(t, whole, Config{})
	full, top := w.open(t, "compact-full", 1), w.open(t, "compact-top", 1)
	const k = 7
	positions := func(s *session) *shardv1.NamedTensor {
		pos := s.tokensTensor([]int32{1, 3})
		pos.Name = tensorname.OutputPositions
		return pos
	}
	prompt := []int32{5, 9, 2, 77}
	full.chunk(full.envelope(1, prefill, 0, 4, 0), full.tokensTensor(prompt), positions(full))
	top.chunk(top.envelope(1, prefill, 0, 4, 0), top.tokensTensor(prompt), positions(top), top.topKTensor(k))
	compare := func(what string, a, b outcome) {
		t.Helper()
		if a.chunk == nil || b.chunk == nil {
			t.Fatalf("%s: %v / %v", what, a.status, b.status)
		}
		logits := payload(t, a.chunk.Bundle.Tensors[0])
		vocab := int(a.chunk.Bundle.Tensors[0].Shape[1])
		ts := b.chunk.Bundle.Tensors
		if len(ts) != 2 || ts[0].Name != tensorname.TopValues || ts[1].Name != tensorname.TopIDs ||
			!slices.Equal(ts[0].Shape, []int64{a.chunk.Bundle.Tensors[0].Shape[0], k}) || !slices.Equal(ts[1].Shape, ts[0].Shape) {
			t.Fatalf("%s: compact output %v", what, ts)
		}
		vals, ids := payload(t, ts[0]), payload(t, ts[1])
		var want, heap []int32
		for r := 0; r*vocab*4 < len(logits); r++ {
			row := make([]float32, vocab)
			for i := range row {
				row[i] = math.Float32frombits(binary.LittleEndian.Uint32(logits[4*(r*vocab+i):]))
			}
			want, heap = argmax.TopK(want, heap, row, k)
			for j, id := range want {
				gotID := int32(binary.LittleEndian.Uint32(ids[4*(r*k+j):]))
				gotV := math.Float32frombits(binary.LittleEndian.Uint32(vals[4*(r*k+j):]))
				if gotID != id || math.Float32bits(gotV) != math.Float32bits(row[id]) {
					t.Fatalf("%s row %d rank %d: id %d value %v, want %d %v", what, r, j, gotID, gotV, id, row[id])
				}
			}
		}
	}
	compare("prefill", full.result(), top.result())
	full.chunk(full.envelope(2, decodeM, 4, 1, 4), full.tokensTensor([]int32{11}))
	top.chunk(top.envelope(2, decodeM, 4, 1, 4), top.tokensTensor([]int32{11}), top.topKTensor(k))
	compare("decode", full.result(), top.result())

	for _, bad := range []int32{0, -1, maxTopK + 1} {
		top.chunk(top.envelope(3, decodeM, 5, 1, 5), top.tokensTensor([]int32{12}), top.topKTensor(bad))
		if o := top.result(); code(o) != cCorrupt {
			t.Fatalf("K=%d: %v", bad, o.status)
		}
	}
	first := startLlama(t, shards[0], Config{})
	s := first.open(t, "compact-first", 1)
	s.chunk(s.envelope(1, prefill, 0, 2, 0), s.tokensTensor([]int32{1, 2}), s.topKTensor(3))
	if o := s.result(); code(o) != cCorrupt {
		t.Fatalf("compact output asked of a shard without logits: %v", o.status)
	}
}
