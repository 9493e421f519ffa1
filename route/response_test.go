package route

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/tensorname"
	"github.com/meshnet/shardd/stages/checksum"
	"github.com/meshnet/shardd/stages/dtype"
	"github.com/meshnet/shardd/stages/frameout"
	"github.com/meshnet/shardd/stages/reassemble"
	"github.com/meshnet/shardd/stages/receive"
)

// frame is a helper for the mangled outputs below.
func frame(f *frameout.Framer, name string, shape []int64, dt shardv1.DType, body []byte) *shardv1.NamedTensor {
	nt := &shardv1.NamedTensor{}
	f.Frame(nt, name, shape, dt, body, frameout.Options{})
	return nt
}

// TestHeadRefusesBadResponses: a worker that answers with a tensor the head
// cannot use fails the generation with a ResponseError naming it, at the
// step where it happens; the head never panics.
func TestHeadRefusesBadResponses(t *testing.T) {
	const vocab = 50
	type mangler = func(step int, f *frameout.Framer, logits []float32) []*shardv1.NamedTensor
	onStep := func(at int, m mangler) mangler {
		return func(step int, f *frameout.Framer, logits []float32) []*shardv1.NamedTensor {
			if step != at {
				return nil
			}
			return m(step, f, logits)
		}
	}
	cases := []struct {
		name   string
		mangle mangler
	}{
		{"bf16 logits", onStep(1, func(_ int, f *frameout.Framer, l []float32) []*shardv1.NamedTensor {
			return []*shardv1.NamedTensor{frame(f, "logits", []int64{1, vocab}, shardv1.DType_DTYPE_BFLOAT16, dtype.AppendF32ToBF16(nil, l))}
		})},
		{"shape larger than the payload", onStep(1, func(_ int, f *frameout.Framer, l []float32) []*shardv1.NamedTensor {
			return []*shardv1.NamedTensor{frame(f, "logits", []int64{1, 4 * vocab}, shardv1.DType_DTYPE_FLOAT32, dtype.AppendF32Bytes(nil, l))}
		})},
		{"short payload", onStep(1, func(_ int, f *frameout.Framer, l []float32) []*shardv1.NamedTensor {
			return []*shardv1.NamedTensor{frame(f, "logits", []int64{1, vocab}, shardv1.DType_DTYPE_FLOAT32, dtype.AppendF32Bytes(nil, l[:3]))}
		})},
		{"one-dimensional logits", onStep(1, func(_ int, f *frameout.Framer, l []float32) []*shardv1.NamedTensor {
			return []*shardv1.NamedTensor{frame(f, "logits", []int64{vocab}, shardv1.DType_DTYPE_FLOAT32, dtype.AppendF32Bytes(nil, l))}
		})},
		{"more rows than were sent", onStep(2, func(_ int, f *frameout.Framer, l []float32) []*shardv1.NamedTensor {
			b := dtype.AppendF32Bytes(dtype.AppendF32Bytes(nil, l), l)
			return []*shardv1.NamedTensor{frame(f, "logits", []int64{2, vocab}, shardv1.DType_DTYPE_FLOAT32, b)}
		})},
		{"vocabulary changes mid-generation", onStep(3, func(_ int, f *frameout.Framer, l []float32) []*shardv1.NamedTensor {
			b := dtype.AppendF32Bytes(nil, append(l, 0, 0))
			return []*shardv1.NamedTensor{frame(f, "logits", []int64{1, vocab + 2}, shardv1.DType_DTYPE_FLOAT32, b)}
		})},
		{"wrong name", onStep(1, func(_ int, f *frameout.Framer, l []float32) []*shardv1.NamedTensor {
			return []*shardv1.NamedTensor{frame(f, "hidden_states", []int64{1, vocab}, shardv1.DType_DTYPE_FLOAT32, dtype.AppendF32Bytes(nil, l))}
		})},
		{"no tensor", onStep(2, func(int, *frameout.Framer, []float32) []*shardv1.NamedTensor {
			return []*shardv1.NamedTensor{}
		})},
		{"two tensors", onStep(1, func(_ int, f *frameout.Framer, l []float32) []*shardv1.NamedTensor {
			b := dtype.AppendF32Bytes(nil, l)
			return []*shardv1.NamedTensor{frame(f, "logits", []int64{1, vocab}, shardv1.DType_DTYPE_FLOAT32, b), frame(f, "logits", []int64{1, vocab}, shardv1.DType_DTYPE_FLOAT32, b)}
		})},
		{"checksum", onStep(2, func(_ int, f *frameout.Framer, l []float32) []*shardv1.NamedTensor {
			nt := frame(f, "logits", []int64{1, vocab}, shardv1.DType_DTYPE_FLOAT32, dtype.AppendF32Bytes(nil, l))
			nt = proto.Clone(nt).(*shardv1.NamedTensor) // the framer's payload may be pooled: corrupt a copy
			nt.Fragments[0].Payload[5] ^= 0x40
			return []*shardv1.NamedTensor{nt}
		})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer()
			shardv1.RegisterShardRuntimeServer(srv, &ackWorker{window: 2, vocab: vocab, mangle: c.mangle})
			go srv.Serve(lis)
			defer srv.Stop()
			r, err := Dial(context.Background(), []string{lis.Addr().String()}, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			_, err = r.Generate(context.Background(), Request{Prompt: []int32{3, 4, 5}, MaxTokens: 6}, func(int32) error { return nil })
			var re *ResponseError
			if !errors.As(err, &re) || !errors.Is(err, ErrResponse) || re.Addr != lis.Addr().String() {
				t.Fatalf("got %v, want a ResponseError from %s", err, lis.Addr())
			}
		})
	}
}

// FuzzHeadResponse feeds arbitrary output tensors to the head's response
// path (checkOutput, then decodeLogits) as a last and as a middle hop: it
// refuses them or reads them, and never panics.
func FuzzHeadResponse(f *testing.F) {
	fr := frameout.New(bufpool.Default)
	defer fr.Close()
	for _, nt := range []*shardv1.NamedTensor{
		frame(fr, "logits", []int64{1, 4}, shardv1.DType_DTYPE_FLOAT32, dtype.AppendF32Bytes(nil, []float32{1, 2, 3, 4})),
		frame(fr, "logits", []int64{1, 4}, shardv1.DType_DTYPE_BFLOAT16, dtype.AppendF32ToBF16(nil, []float32{1, 2, 3, 4})),
		frame(fr, "hidden_states", []int64{2, 2}, shardv1.DType_DTYPE_BFLOAT16, dtype.AppendF32ToBF16(nil, []float32{1, 2, 3, 4})),
	} {
		b, _ := proto.Marshal(nt)
		f.Add(b, uint8(1))
	}
	f.Fuzz(func(t *testing.T, b []byte, rows uint8) {
		nt := &shardv1.NamedTensor{}
		if proto.Unmarshal(b, nt) != nil {
			return
		}
		g := &gen{recv: receive.New(receive.Config{Budget: reassemble.Budget{MaxTensorBytes: 1 << 20}, Checksum: checksum.Policy{Require: true}}, bufpool.Default)}
		defer g.recv.Close()
		g.streams = []*hopStream{{hop: &Hop{Addr: "a"}}, {hop: &Hop{Addr: "b"}}}
		n := int(rows%8) + 1
		ts := []*shardv1.NamedTensor{nt}
		g.checkOutput(0, ts, n)
		if g.checkOutput(1, ts, n) == nil {
			if l, err := g.decodeLogits(nt); err == nil && len(l) != int(nt.Shape[1]) {
				t.Fatalf("%d logits for shape %v", len(l), nt.Shape)
			}
		}
	})
}

// compactOf frames a last hop's compact output of one row.
func compactOf(f *frameout.Framer, vals []float32, ids []int32) []*shardv1.NamedTensor {
	ib := make([]byte, 0, 4*len(ids))
	for _, id := range ids {
		ib = append(ib, byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
	}
	shape := []int64{1, int64(len(ids))}
	return []*shardv1.NamedTensor{
		frame(f, tensorname.TopValues, shape, shardv1.DType_DTYPE_FLOAT32, dtype.AppendF32Bytes(nil, vals)),
		frame(f, tensorname.TopIDs, slices.Clone(shape), shardv1.DType_DTYPE_INT32, ib),
	}
}

// TestHeadRefusesBadCompactOutput: compact output the head cannot trust
// (out of order, an id outside any vocabulary, more than asked, a missing
// tensor, a bad checksum) is a ResponseError; a good one is read.
func TestHeadRefusesBadCompactOutput(t *testing.T) {
	fr := frameout.New(bufpool.Default)
	defer fr.Close()
	g := &gen{recv: receive.New(receive.Config{Budget: reassemble.Budget{MaxTensorBytes: 1 << 20}, Checksum: checksum.Policy{Require: true}}, bufpool.Default), topK: 3}
	defer g.recv.Close()
	g.streams = []*hopStream{{hop: &Hop{Addr: "a"}}}
	read := func(ts []*shardv1.NamedTensor) error {
		if err := g.checkOutput(0, ts, 1); err != nil {
			return err
		}
		return g.decodeTop(ts)
	}
	if err := read(compactOf(fr, []float32{3, 2, 2}, []int32{7, 1, 4})); err != nil || !slices.Equal(g.topIDs, []int32{7, 1, 4}) {
		t.Fatalf("good compact output: %v, ids %v", err, g.topIDs)
	}
	// Fewer than K: the worker's whole vocabulary, read as a whole row.
	if err := read(compactOf(fr, []float32{3, 2}, []int32{1, 0})); err != nil || !slices.Equal(g.logits, []float32{2, 3}) {
		t.Fatalf("a whole vocabulary of 2: %v, row %v", err, g.logits)
	}
	badCRC := compactOf(fr, []float32{3, 2}, []int32{7, 1})
	badCRC[1].Checksum.Value[0] ^= 1
	for name, ts := range map[string][]*shardv1.NamedTensor{
		"out of order":   compactOf(fr, []float32{2, 3}, []int32{7, 1}),
		"tie, ids down":  compactOf(fr, []float32{2, 2}, []int32{7, 1}),
		"negative id":    compactOf(fr, []float32{3, 2}, []int32{7, -1}),
		"id past limits": compactOf(fr, []float32{3, 2}, []int32{7, maxVocab}),
		"more than K":    compactOf(fr, []float32{4, 3, 2, 1}, []int32{1, 2, 3, 4}),
		"one tensor":     compactOf(fr, []float32{3}, []int32{7})[:1],
		"bad checksum":   badCRC,
		"short, not all": compactOf(fr, []float32{3, 2}, []int32{5, 0}),
		"short, twice":   compactOf(fr, []float32{3, 3}, []int32{0, 0}),
	} {
		var re *ResponseError
		if err := read(ts); !errors.As(err, &re) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzHeadCompact: any bundle as a last hop's compact output is read or
// refused, never a panic, and what is read is K valid ids in order.
func FuzzHeadCompact(f *testing.F) {
	fr := frameout.New(bufpool.Default)
	defer fr.Close()
	seed, _ := proto.Marshal(&shardv1.TensorBundle{Tensors: compactOf(fr, []float32{3, 2, 2}, []int32{7, 1, 4})})
	f.Add(seed, uint8(3))
	f.Fuzz(func(t *testing.T, b []byte, k uint8) {
		bundle := &shardv1.TensorBundle{}
		if proto.Unmarshal(b, bundle) != nil {
			return
		}
		g := &gen{recv: receive.New(receive.Config{Budget: reassemble.Budget{MaxTensorBytes: 1 << 20}, Checksum: checksum.Policy{Require: true}}, bufpool.Default),
			topK: int(k%16) + 1}
		defer g.recv.Close()
		g.streams = []*hopStream{{hop: &Hop{Addr: "a"}}}
		if g.checkOutput(0, bundle.Tensors, 2) != nil || g.decodeTop(bundle.Tensors) != nil {
			return
		}
		if len(g.topIDs) != len(g.topVals) || len(g.topIDs) < 1 || len(g.topIDs) > g.topK {
			t.Fatalf("%d ids and %d values for K %d", len(g.topIDs), len(g.topVals), g.topK)
		}
		for _, id := range g.topIDs {
			if id < 0 || id >= maxVocab {
				t.Fatalf("id %d", id)
			}
		}
	})
}
