package bench

import (
	"testing"

	"google.golang.org/grpc/mem"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/stages"
	"github.com/meshnet/shardd/stages/checksum"
	"github.com/meshnet/shardd/stages/decode"
	"github.com/meshnet/shardd/stages/dtype"
	"github.com/meshnet/shardd/stages/frameout"
	"github.com/meshnet/shardd/stages/reassemble"
	"github.com/meshnet/shardd/stages/receive"
)

// framedWire returns the serialized NamedTensor of a bf16 body of n bytes in
// fragments of frag bytes, as a peer would send it.
func framedWire(b *testing.B, n, frag int) []byte {
	body := make([]byte, n)
	for i := range body {
		body[i] = byte(i*31 + i>>9)
	}
	f := frameout.New(bufpool.Default)
	defer f.Close()
	var nt shardv1.NamedTensor
	if owned := f.Frame(&nt, "hidden_states", []int64{int64(n / 2)}, shardv1.DType_DTYPE_BFLOAT16, body,
		frameout.Options{FragmentBytes: frag}); owned != nil {
		b.Fatal("bf16 test body compressed")
	}
	wire, err := nt.MarshalVT()
	if err != nil {
		b.Fatal(err)
	}
	return wire
}

// BenchmarkValidate32MiB: tiling + CRC32C of a 32 MiB uncompressed bundle in
// 1 MiB fragments, against a memcpy of the same bytes in the same run.
// Target: validate >= 0.8x memcpy bandwidth.
func BenchmarkValidate32MiB(b *testing.B) {
	const size = 32 << 20
	wire := framedWire(b, size, 1<<20)
	var nt shardv1.NamedTensor
	if err := nt.UnmarshalVTUnsafe(wire); err != nil {
		b.Fatal(err)
	}
	budget := reassemble.Budget{MaxTensorBytes: 1 << 30}
	b.Run("validate", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(size)
		var t stages.Tensor
		for b.Loop() {
			if err := reassemble.Into(&t, &nt, budget); err != nil {
				b.Fatal(err)
			}
			if err := checksum.Verify(t.Checksum, t.Segments(), checksum.Policy{Require: true}); err != nil {
				b.Fatal(err)
			}
		}
		t.Reset()
	})
	b.Run("memcpy", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(size)
		src := make([]byte, size)
		copy(src, wire)
		dst := make([]byte, size)
		for b.Loop() {
			copy(dst, src)
		}
	})
}

// BenchmarkDecodeStepReceive: one decode step (1 token x 4096 hidden, bf16)
// through every receive stage: codec unmarshal (aliasing the gRPC buffer),
// reassemble, decompress (a no-op for NONE), checksum, and bf16 -> f32 into
// the backend's batch memory. Target: 0 allocations.
func BenchmarkDecodeStepReceive(b *testing.B) {
	const hidden = 4096
	body := make([]byte, 2*hidden)
	for i := range body {
		body[i] = byte(i * 13)
	}
	f := frameout.New(bufpool.Default)
	defer f.Close()
	req := &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Decode{Decode: &shardv1.DecodeStep{
		IdempotencyStep: 9, Position: 120, ExpectedPastLen: 120, WorkId: "work-9", DeadlineUnixNanos: 1 << 62,
		Tensor: &shardv1.NamedTensor{},
	}}}
	f.Frame(req.GetDecode().Tensor, "hidden_states", []int64{1, 1, hidden}, shardv1.DType_DTYPE_BFLOAT16, body, frameout.Options{})
	wire, err := req.MarshalVT()
	if err != nil {
		b.Fatal(err)
	}
	pool := bufpool.Default
	codec := decode.Codec{Pool: pool}
	pipe := receive.New(receive.Config{
		Budget:   reassemble.Budget{MaxTensorBytes: 64 << 20},
		Checksum: checksum.Policy{Require: true},
	}, pool)
	defer pipe.Close()
	raw := pool.Get(len(wire))
	copy(*raw, wire)
	frame := mem.NewBuffer(raw, pool)
	defer frame.Free()
	batch := make([]float32, 0, hidden)
	var in decode.Inbound
	var t stages.Tensor

	b.ReportAllocs()
	b.SetBytes(int64(len(wire)))
	for b.Loop() {
		if err := codec.Unmarshal(mem.BufferSlice{frame}, &in); err != nil {
			b.Fatal(err)
		}
		if err := pipe.Tensor(&t, in.Msg.GetDecode().GetTensor(), false); err != nil {
			b.Fatal(err)
		}
		batch = dtype.AppendBF16ToF32(batch[:0], t.Contiguous(pool))
		t.Reset()
		in.Release()
	}
	if len(batch) != hidden {
		b.Fatal("conversion lost elements")
	}
}
