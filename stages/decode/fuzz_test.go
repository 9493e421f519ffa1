package decode

import (
	"bytes"
	"encoding/binary"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/meshnet/shardd/bufpool/bufpooltest"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// FuzzCodecDecode feeds arbitrary wire bytes, in one frame or split in two
// (the materializing path), to the codec's zero-copy decoders: a request
// into an Inbound, a response into a Response. Nothing panics, releasing
// returns every pooled buffer, and whatever both decode, the codec decodes
// as the protobuf runtime does. vtprotobuf checks less than the runtime:
// it does not check that strings are UTF-8 (the engine refuses identifiers
// that are not), keeps unknown fields' bytes without checking group
// markers, and so on; what only it accepts must still be a message that
// re-encodes and decodes to itself, so nothing downstream sees a
// half-decoded one.
func FuzzCodecDecode(f *testing.F) {
	wire, _ := decodeStepWire(f, 16)
	f.Add(wire, uint16(0))
	f.Add(wire, uint16(7))
	chunk, _ := (&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Chunk{Chunk: &shardv1.ActivationChunk{
		Envelope: &shardv1.Envelope{SchemaVersion: 1, WorkId: "w", RouteSessionId: "s", Position: &shardv1.PositionSpan{TokenCount: 2}},
		Bundle: &shardv1.TensorBundle{BundleVersion: 1, Tensors: []*shardv1.NamedTensor{{Name: "input_ids", Shape: []int64{2},
			Dtype: shardv1.DType_DTYPE_INT32, TotalBytes: 8, Fragments: []*shardv1.TensorFragment{{FragmentCount: 1, Payload: make([]byte, 8)}}}}},
	}}}).MarshalVT()
	f.Add(chunk, uint16(3))
	resp, _ := (&shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Ack{Ack: &shardv1.Ack{WorkId: "w", IdempotencyStep: 3}}}).MarshalVT()
	f.Add(resp, uint16(1))
	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		pool := bufpooltest.New(t)
		codec := Codec{Pool: pool}
		frames := func() mem.BufferSlice {
			if c := int(cut); c > 0 && c < len(b) {
				return mem.BufferSlice{mem.Copy(b[:c], pool), mem.Copy(b[c:], pool)}
			}
			return mem.BufferSlice{mem.Copy(b, pool)}
		}
		check := func(got, want, again proto.Message, runtimeOK bool, vt interface {
			MarshalVT() ([]byte, error)
		}, unmarshalAgain func([]byte) error) {
			if runtimeOK {
				// Unknown fields are kept as raw bytes by both, but not
				// always cut alike; the engine never reads them.
				dropUnknown(got.ProtoReflect())
				dropUnknown(want.ProtoReflect())
				if !proto.Equal(got, want) {
					t.Fatalf("decoded %v, the runtime %v", got, want)
				}
				return
			}
			re, err := vt.MarshalVT()
			if err != nil {
				t.Fatalf("a message only the codec accepts does not re-encode: %v", err)
			}
			if err := unmarshalAgain(re); err != nil {
				t.Fatalf("a message only the codec accepts does not decode again: %v", err)
			}
		}

		var in Inbound
		data := frames()
		err := codec.Unmarshal(data, &in)
		data.Free()
		if err == nil {
			want, again := &shardv1.SessionRequest{}, &shardv1.SessionRequest{}
			check(in.Msg, want, again, proto.Unmarshal(b, want) == nil, in.Msg, again.UnmarshalVT)
		}
		in.Release()

		var r Response
		data = frames()
		err = codec.Unmarshal(data, &r)
		data.Free()
		if err == nil {
			want, again := &shardv1.SessionResponse{}, &shardv1.SessionResponse{}
			check(&r.Msg, want, again, proto.Unmarshal(b, want) == nil, &r.Msg, again.UnmarshalVT)
		}
		r.Release()
	})
}

// dropUnknown clears the unknown fields of m and every message in it.
func dropUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.Message() == nil || fd.IsMap():
		case fd.IsList():
			for i := 0; i < v.List().Len(); i++ {
				dropUnknown(v.List().Get(i).Message())
			}
		default:
			dropUnknown(v.Message())
		}
		return true
	})
}

// FuzzSplicedEncoder: a chunk response whose fragments lie in a result body
// at offsets and lengths the fuzzer picks (some outside it, some below
// MinSplice) is encoded by the spliced Marshal byte for byte as MarshalVT
// encodes it, and every reference it takes on the body is dropped when gRPC
// frees the slice.
func FuzzSplicedEncoder(f *testing.F) {
	f.Add([]byte{0, 0, 0, 64, 1, 0, 0, 4, 0, 1}, "rs-1", uint64(3))
	f.Add([]byte{0, 16, 0, 32, 0, 0, 48, 0, 0, 1, 2, 0, 9, 0, 0, 0}, "", uint64(0))
	f.Fuzz(func(t *testing.T, spec []byte, session string, step uint64) {
		pool := bufpooltest.New(t)
		const bodyLen = 160 << 10
		body := pool.Alloc(bodyLen)
		defer body.Release()
		bb := body.Bytes()
		for i := range bb {
			bb[i] = byte(i*13 + i>>8)
		}
		outside := bytes.Repeat([]byte{7}, 20<<10)
		// Each 5 bytes of spec: offset (2 bytes, in 256-byte units), length
		// (2 bytes, in 64-byte units), and whether the fragment starts a
		// new tensor (bit 0) or lies outside the body (bit 1).
		var tensors []*shardv1.NamedTensor
		for len(spec) >= 5 && len(tensors) < 8 {
			off := int(binary.LittleEndian.Uint16(spec)) * 256 % bodyLen
			n := int(binary.LittleEndian.Uint16(spec[2:])) * 64 % (bodyLen - off + 1)
			flags := spec[4]
			spec = spec[5:]
			p := bb[off : off+n]
			if flags&2 != 0 {
				p = outside[:min(n, len(outside))]
			}
			if len(tensors) == 0 || flags&1 != 0 {
				tensors = append(tensors, &shardv1.NamedTensor{Name: "logits", Dtype: shardv1.DType_DTYPE_FLOAT32,
					Checksum: &shardv1.Checksum{Algorithm: shardv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, Value: []byte{1, 2, 3, 4}}})
			}
			nt := tensors[len(tensors)-1]
			nt.Fragments = append(nt.Fragments, &shardv1.TensorFragment{FragmentIndex: uint32(len(nt.Fragments)), ByteOffset: nt.TotalBytes, Payload: p})
			nt.TotalBytes += uint64(len(p))
		}
		var env *shardv1.Envelope
		if session != "" {
			env = &shardv1.Envelope{SchemaVersion: 1, RouteSessionId: session, IdempotencyStep: step}
		}
		msg := &shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Chunk{Chunk: &shardv1.ActivationChunk{
			Envelope: env, Bundle: &shardv1.TensorBundle{BundleVersion: 1, Tensors: tensors}}}}
		want, err := msg.MarshalVT()
		if err != nil {
			t.Fatal(err)
		}
		data, err := Codec{Pool: pool}.Marshal(&Spliced{Msg: msg, Body: body})
		if err != nil {
			t.Fatal(err)
		}
		if got := data.Materialize(); !bytes.Equal(got, want) {
			t.Fatalf("spliced wire differs from MarshalVT: %d bytes, want %d", len(got), len(want))
		}
		data.Free()
		if again, _ := msg.MarshalVT(); !bytes.Equal(again, want) {
			t.Fatal("Marshal left the message changed")
		}
	})
}
