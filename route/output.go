// Output checks: what a hop returns is checked against what was asked
// (names, shapes, dtypes, fragments and their CRC32C) before the head
// uses it, and the last hop's logits are decoded: a whole row, or the
// compact top-K a worker returns instead.

package route

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/sharderr"
	"github.com/meshnet/shardd/internal/tensorname"
	"github.com/meshnet/shardd/stages"
	"github.com/meshnet/shardd/stages/dtype"
)

// checkOutput refuses a hop's output the head cannot pass on or use: not
// exactly one tensor, or one of the wrong name, dtype or shape for rows
// input rows. A hidden state's width must stay what the hop first sent.
// (Payload sizes and checksums are checked where the bytes are read: the
// next hop for hidden states, decodeLogits for logits.)
func (g *gen) checkOutput(i int, ts []*shardv1.NamedTensor, rows int) error {
	bad := func(format string, args ...any) error {
		return &ResponseError{Addr: g.streams[i].hop.Addr, Detail: fmt.Sprintf(format, args...)}
	}
	if i == len(g.streams)-1 && g.topK > 0 {
		return g.checkTop(ts, rows, bad)
	}
	if len(ts) != 1 || ts[0] == nil {
		return bad("%d output tensors, want 1", len(ts))
	}
	nt := ts[0]
	if i == len(g.streams)-1 {
		if nt.Name != tensorname.Logits || nt.Dtype != shardv1.DType_DTYPE_FLOAT32 {
			return bad("the last hop returned %.64q as %s, want logits as FLOAT32", nt.Name, nt.Dtype)
		}
		if len(nt.Shape) != 2 || nt.Shape[0] < 1 || nt.Shape[0] > int64(rows) || nt.Shape[1] < 1 || nt.Shape[1] > maxVocab ||
			(g.stats.Vocab != 0 && nt.Shape[1] != int64(g.stats.Vocab)) {
			return bad("logits shape %v for %d input rows (vocabulary %d)", nt.Shape, rows, g.stats.Vocab)
		}
		return nil
	}
	if nt.Name != tensorname.Hidden || (nt.Dtype != shardv1.DType_DTYPE_BFLOAT16 && nt.Dtype != shardv1.DType_DTYPE_FLOAT32) {
		return bad("returned %.64q as %s, want hidden_states as BFLOAT16 or FLOAT32", nt.Name, nt.Dtype)
	}
	width := &g.streams[i].hidden
	if len(nt.Shape) != 2 || nt.Shape[0] != int64(rows) || nt.Shape[1] < 1 || nt.Shape[1] > maxHidden || (*width != 0 && nt.Shape[1] != *width) {
		return bad("hidden_states shape %v for %d input rows", nt.Shape, rows)
	}
	*width = nt.Shape[1]
	g.streams[i].hop.rowBytes.Store(nt.Shape[1] * int64(dtype.Size(nt.Dtype)))
	return nil
}

// checkTop refuses a last hop's compact output of the wrong form: the two
// tensors (values FLOAT32, ids INT32) of one shape [rows' <= rows, K' <=
// the K asked].
func (g *gen) checkTop(ts []*shardv1.NamedTensor, rows int, bad func(string, ...any) error) error {
	if len(ts) != 2 || ts[0] == nil || ts[1] == nil {
		return bad("%d output tensors, want the compact output's 2", len(ts))
	}
	v, id := ts[0], ts[1]
	if v.Name != tensorname.TopValues || v.Dtype != shardv1.DType_DTYPE_FLOAT32 || id.Name != tensorname.TopIDs || id.Dtype != shardv1.DType_DTYPE_INT32 {
		return bad("the last hop returned %.64q as %s and %.64q as %s, want %s as FLOAT32 and %s as INT32",
			v.Name, v.Dtype, id.Name, id.Dtype, tensorname.TopValues, tensorname.TopIDs)
	}
	if len(v.Shape) != 2 || v.Shape[0] < 1 || v.Shape[0] > int64(rows) || v.Shape[1] < 1 || v.Shape[1] > int64(g.topK) ||
		!slices.Equal(v.Shape, id.Shape) {
		return bad("compact output shapes %v and %v for %d input rows and %d asked", v.Shape, id.Shape, rows, g.topK)
	}
	return nil
}

// decodeTop reads the last hop's compact output (already checked by
// checkTop), each tensor tiled and checked by CRC32C, into g.topIDs and
// g.topVals: the last row's best tokens, which must be valid ids in the
// ranking's order (larger logit first, ties to the lower id).
func (g *gen) decodeTop(ts []*shardv1.NamedTensor) error {
	addr := g.streams[len(g.streams)-1].hop.Addr
	g.logits = g.logits[:0]
	var vt, it stages.Tensor
	defer vt.Reset()
	defer it.Reset()
	for _, x := range []struct {
		t  *stages.Tensor
		nt *shardv1.NamedTensor
	}{{&vt, ts[0]}, {&it, ts[1]}} {
		if err := g.recv.Tensor(x.t, x.nt, true); err != nil {
			return &ResponseError{Addr: addr, Detail: x.nt.Name + ": " + sharderr.From(err).Detail}
		}
	}
	rows, k := int(ts[0].Shape[0]), int(ts[0].Shape[1])
	vb, ib := vt.Contiguous(bufpool.Default), it.Contiguous(bufpool.Default)
	if len(vb) != 4*rows*k || len(ib) != 4*rows*k {
		return &ResponseError{Addr: addr, Detail: fmt.Sprintf("compact output of shape %v in %d and %d bytes", ts[0].Shape, len(vb), len(ib))}
	}
	g.topVals = dtype.AppendF32FromBytes(g.topVals[:0], vb[len(vb)-4*k:])
	g.topIDs = g.topIDs[:0]
	for j := len(ib) - 4*k; j < len(ib); j += 4 {
		g.topIDs = append(g.topIDs, int32(binary.LittleEndian.Uint32(ib[j:])))
	}
	for j, id := range g.topIDs {
		if id < 0 || id >= maxVocab {
			return &ResponseError{Addr: addr, Detail: fmt.Sprintf("compact output token id %d", id)}
		}
		if j > 0 {
			a, b := g.topVals[j-1], g.topVals[j]
			if !(a > b || (a == b && g.topIDs[j-1] < id)) {
				return &ResponseError{Addr: addr, Detail: fmt.Sprintf("compact output out of order at %d", j)}
			}
		}
	}
	if k < g.topK {
		return g.wholeRow(addr)
	}
	return nil
}

// wholeRow rebuilds, from a compact output of fewer than K entries, the
// whole logits row it is: every id of the vocabulary exactly once.
func (g *gen) wholeRow(addr string) error {
	k := len(g.topIDs)
	g.logits = slices.Grow(g.logits[:0], k)[:k]
	seen := make([]bool, k)
	for j, id := range g.topIDs {
		if int(id) >= k || seen[id] {
			return &ResponseError{Addr: addr, Detail: fmt.Sprintf("compact output of %d of %d asked is not a whole vocabulary", k, g.topK)}
		}
		seen[id] = true
		g.logits[id] = g.topVals[j]
	}
	g.stats.Vocab = k
	return nil
}

// Bounds on what a worker may claim: no model the head drives is wider.
const (
	maxVocab  = 1 << 22
	maxHidden = 1 << 17
)

// decodeLogits reads the last hop's logits tensor (already checked by
// checkOutput): its fragments must tile it and pass CRC32C, and its bytes
// must be exactly its shape's. It returns the last row.
func (g *gen) decodeLogits(nt *shardv1.NamedTensor) ([]float32, error) {
	addr := g.streams[len(g.streams)-1].hop.Addr
	var t stages.Tensor
	defer t.Reset()
	if err := g.recv.Tensor(&t, nt, true); err != nil {
		return nil, &ResponseError{Addr: addr, Detail: "logits: " + sharderr.From(err).Detail}
	}
	body := t.Contiguous(bufpool.Default)
	rows, vocab := int(nt.Shape[0]), int(nt.Shape[1])
	if len(body) != 4*rows*vocab {
		return nil, &ResponseError{Addr: addr, Detail: fmt.Sprintf("logits of shape %v in %d bytes", nt.Shape, len(body))}
	}
	g.stats.Vocab = vocab
	g.logits = dtype.AppendF32FromBytes(g.logits[:0], body[len(body)-4*vocab:])
	return g.logits, nil
}

// ResponseError is a worker's response the head cannot use (a wrong tensor
// name, dtype, shape, size or checksum). It matches ErrResponse with
// errors.Is. The step is not retried: a worker that answers so is broken,
// not unlucky.
type ResponseError struct {
	Addr   string
	Detail string
}

func (e *ResponseError) Error() string {
	return fmt.Sprintf("%v: %s: %s", ErrResponse, e.Addr, e.Detail)
}

func (e *ResponseError) Unwrap() error { return ErrResponse }

// maxResponseBytes bounds one message from a worker.
const maxResponseBytes = 256 << 20
