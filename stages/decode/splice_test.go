package decode

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc/mem"

	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/bufpool/bufpooltest"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// TestSplicedWireIsMarshalVT: for responses of several shapes (one large
// fragment, several fragments of which some are small, a second tensor that
// lies outside the body, no envelope, a payload outside the body), Marshal of
// a Spliced gives exactly the bytes of MarshalVT, references the body instead
// of copying the large payloads, and holds one reference on the body per
// spliced payload until gRPC frees the slice.
func TestSplicedWireIsMarshalVT(t *testing.T) {
	pool := bufpooltest.New(t)
	body := pool.Alloc(200 << 10)
	defer body.Release()
	b := body.Bytes()
	for i := range b {
		b[i] = byte(i*7 + i>>9)
	}
	outside := bytes.Repeat([]byte{9}, 40<<10)
	frag := func(i, n int, off uint64, p []byte) *shardv1.TensorFragment {
		return &shardv1.TensorFragment{FragmentIndex: uint32(i), FragmentCount: uint32(n), ByteOffset: off, Payload: p}
	}
	tensor := func(name string, frags ...*shardv1.TensorFragment) *shardv1.NamedTensor {
		total := 0
		for _, f := range frags {
			total += len(f.Payload)
		}
		return &shardv1.NamedTensor{Name: name, Shape: []int64{1, int64(total / 4)}, Dtype: shardv1.DType_DTYPE_FLOAT32,
			ByteOrder: shardv1.ByteOrder_BYTE_ORDER_LITTLE_ENDIAN, TotalBytes: uint64(total),
			Compression: shardv1.Compression_COMPRESSION_NONE,
			Checksum:    &shardv1.Checksum{Algorithm: shardv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, Value: []byte{1, 2, 3, 4}},
			Fragments:   frags}
	}
	env := &shardv1.Envelope{SchemaVersion: 1, WorkId: "rs-9/4", RouteSessionId: "rs-9", RouteEpoch: 1, IdempotencyStep: 4,
		Phase: shardv1.Phase_PHASE_DECODE, Position: &shardv1.PositionSpan{FirstPosition: 12, TokenCount: 1}}
	cases := []struct {
		name    string
		env     *shardv1.Envelope
		tensors []*shardv1.NamedTensor
		splices int
	}{
		{"one large fragment", env, []*shardv1.NamedTensor{tensor("logits", frag(0, 1, 0, b[:128<<10]))}, 1},
		{"large and small fragments", env, []*shardv1.NamedTensor{tensor("hidden_states",
			frag(0, 3, 0, b[:64<<10]), frag(1, 3, 64<<10, b[64<<10:(64<<10)+100]), frag(2, 3, (64<<10)+100, b[(64<<10)+100:200<<10]))}, 2},
		{"second tensor outside the body", env, []*shardv1.NamedTensor{
			tensor("hidden_states", frag(0, 1, 0, b[:32<<10])), tensor("output_positions", frag(0, 1, 0, outside))}, 1},
		{"no envelope", nil, []*shardv1.NamedTensor{tensor("logits", frag(0, 1, 0, b[8:(8+(96<<10))]))}, 1},
		{"nothing to splice", env, []*shardv1.NamedTensor{tensor("logits", frag(0, 1, 0, outside))}, 0},
	}
	codec := Codec{Pool: pool}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msg := &shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Chunk{Chunk: &shardv1.ActivationChunk{
				Envelope: tc.env, Bundle: &shardv1.TensorBundle{BundleVersion: 1, Tensors: tc.tensors}}}}
			want, err := msg.MarshalVT()
			if err != nil {
				t.Fatal(err)
			}
			data, err := codec.Marshal(&Spliced{Msg: msg, Body: body})
			if err != nil {
				t.Fatal(err)
			}
			if got := data.Materialize(); !bytes.Equal(got, want) {
				t.Fatalf("wire differs from MarshalVT: %d bytes, want %d", len(got), len(want))
			}
			aliased := 0
			for _, buf := range data {
				if within(buf.ReadOnlyData(), b) {
					aliased++
				}
			}
			if aliased != tc.splices {
				t.Fatalf("%d segments reference the body, want %d", aliased, tc.splices)
			}
			// The message is unchanged (the encoder restores what it moves aside).
			if again, _ := msg.MarshalVT(); !bytes.Equal(again, want) {
				t.Fatal("marshaling changed the message")
			}
			data.Free()
		})
	}
	// Every spliced reference was dropped by Free: the last Release (the
	// deferred one) returns the body, which bufpooltest checks.
	var ack mem.BufferSlice
	ack, err := codec.Marshal(&Spliced{Msg: &shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Ack{Ack: &shardv1.Ack{IdempotencyStep: 4}}}, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	ack.Free()
}

// A spliced payload gRPC drops without freeing (its writer exits on a
// connection error with frames still queued) gives its body reference
// back once gRPC's buffer is unreachable, so the body returns to the pool.
func TestSplicedReferenceDroppedUnfreed(t *testing.T) {
	pool := bufpooltest.New(t)
	body := pool.Alloc(64 << 10)
	msg := &shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Chunk{Chunk: &shardv1.ActivationChunk{
		Bundle: &shardv1.TensorBundle{BundleVersion: 1, Tensors: []*shardv1.NamedTensor{{Name: "logits",
			Fragments: []*shardv1.TensorFragment{{FragmentCount: 1, Payload: body.Bytes()}}}}}}}}
	data, err := Codec{Pool: pool}.Marshal(&Spliced{Msg: msg, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < 2 {
		t.Fatalf("nothing was spliced: %d segments", len(data))
	}
	body.Release() // the sender's reference; gRPC's is now the only one
	if pool.Outstanding() != 1 {
		t.Fatalf("%d outstanding before the drop", pool.Outstanding())
	}
	data = nil // dropped, never freed
	waitReturned(t, pool, "the body")
}

// waitReturned runs GCs until pool has nothing outstanding, for 10 s at
// most.
func waitReturned(t *testing.T, pool *bufpool.Pool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for pool.Outstanding() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s never went back to the pool", what)
		}
		runtime.GC()
		runtime.Gosched()
	}
}

// A marshal buffer gRPC frees goes back to the pool once; one gRPC drops
// without freeing (a frame for a stream already reset) goes back once
// gRPC's buffer is unreachable, as a spliced payload does.
func TestMarshalBufferDroppedUnfreed(t *testing.T) {
	pool := bufpooltest.New(t)
	codec := Codec{Pool: pool}
	msg := &shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Chunk{Chunk: &shardv1.ActivationChunk{
		Bundle: &shardv1.TensorBundle{BundleVersion: 1, Tensors: []*shardv1.NamedTensor{{Name: "hidden",
			Fragments: []*shardv1.TensorFragment{{FragmentCount: 1, Payload: make([]byte, 4<<10)}}}}}}}}
	want, err := msg.MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	data, err := codec.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	if got := data.Materialize(); !bytes.Equal(got, want) {
		t.Fatal("wire differs from MarshalVT")
	}
	if pool.Outstanding() != 1 {
		t.Fatalf("%d outstanding, want the marshal buffer", pool.Outstanding())
	}
	data.Free()
	if pool.Outstanding() != 0 {
		t.Fatalf("%d outstanding after gRPC's Free", pool.Outstanding())
	}
	for range 3 { // the cleanup of a returned buffer gives nothing back twice
		runtime.GC()
		time.Sleep(10 * time.Millisecond) // cleanups run on a goroutine of their own
	}
	if pool.Outstanding() != 0 {
		t.Fatalf("%d outstanding after the cleanup of a returned buffer", pool.Outstanding())
	}

	if _, err := codec.Marshal(msg); err != nil { // dropped, never freed
		t.Fatal(err)
	}
	if pool.Outstanding() != 1 {
		t.Fatalf("%d outstanding before the drop", pool.Outstanding())
	}
	waitReturned(t, pool, "the marshal buffer")
}
