package decode

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"

	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/bufpool/bufpooltest"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func decodeStepWire(t testing.TB, hidden int) ([]byte, []byte) {
	t.Helper()
	payload := make([]byte, 2*hidden)
	for i := range payload {
		payload[i] = byte(i)
	}
	req := &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Decode{Decode: &shardv1.DecodeStep{
		IdempotencyStep: 7, Position: 3, ExpectedPastLen: 3, WorkId: "w-7",
		Tensor: &shardv1.NamedTensor{
			Name: "hidden_states", Shape: []int64{1, 1, int64(hidden)},
			Dtype: shardv1.DType_DTYPE_BFLOAT16, ByteOrder: shardv1.ByteOrder_BYTE_ORDER_LITTLE_ENDIAN,
			TotalBytes: uint64(len(payload)), Compression: shardv1.Compression_COMPRESSION_NONE,
			Fragments: []*shardv1.TensorFragment{{FragmentCount: 1, Payload: payload}},
		},
	}}}
	wire, err := req.MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	return wire, payload
}

func TestInboundAliasesSingleBuffer(t *testing.T) {
	pool := bufpooltest.New(t)
	// Above mem.IsBelowBufferPoolingThreshold, so gRPC pools the buffer.
	wire, payload := decodeStepWire(t, 1024)
	raw := pool.Get(len(wire))
	copy(*raw, wire)
	data := mem.BufferSlice{mem.NewBuffer(raw, pool)}

	var in Inbound
	if err := (Codec{Pool: pool}).Unmarshal(data, &in); err != nil {
		t.Fatal(err)
	}
	data.Free() // gRPC frees its reference as soon as Unmarshal returns
	got := in.Msg.GetDecode().GetTensor().GetFragments()[0].GetPayload()
	if !bytes.Equal(got, payload) {
		t.Fatal("payload differs after gRPC released its reference")
	}
	if !within(got, (*raw)[:cap(*raw)]) || in.Materialized() {
		t.Fatal("payload was copied instead of aliased")
	}
	if pool.Outstanding() != 1 {
		t.Fatalf("outstanding %d, want the aliased buffer only", pool.Outstanding())
	}
	in.Release()
	in.Release() // idempotent
}

func TestInboundMaterializesMultiFrame(t *testing.T) {
	pool := bufpooltest.New(t)
	wire, payload := decodeStepWire(t, 4096)
	var data mem.BufferSlice
	for off := 0; off < len(wire); off += 3000 {
		data = append(data, mem.Copy(wire[off:min(len(wire), off+3000)], pool))
	}
	var in Inbound
	if err := (Codec{Pool: pool}).Unmarshal(data, &in); err != nil {
		t.Fatal(err)
	}
	data.Free()
	if !in.Materialized() {
		t.Fatal("a multi-frame message must be materialized")
	}
	if !bytes.Equal(in.Msg.GetDecode().GetTensor().GetFragments()[0].GetPayload(), payload) {
		t.Fatal("payload differs")
	}
	in.Release()
}

func TestUnmarshalCorruptFrame(t *testing.T) {
	pool := bufpooltest.New(t)
	var in Inbound
	data := mem.BufferSlice{mem.Copy([]byte{0x12, 0xff, 0xff}, pool)}
	if err := (Codec{Pool: pool}).Unmarshal(data, &in); err == nil {
		t.Fatal("corrupt frame decoded")
	}
	data.Free()
	if in.Live() || in.Msg.GetKind() != nil {
		t.Fatal("failed decode left a message")
	}
}

// echoServer receives through the codec and acknowledges each decode step
// with the CRC-free byte count it saw, proving the aliased payload is intact.
type echoServer struct {
	shardv1.UnimplementedShardRuntimeServer
}

func (echoServer) Session(stream grpc.BidiStreamingServer[shardv1.SessionRequest, shardv1.SessionResponse]) error {
	var in Inbound
	defer in.Release()
	for {
		if err := stream.RecvMsg(&in); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		d := in.Msg.GetDecode()
		var sum uint64
		for _, b := range d.GetTensor().GetFragments()[0].GetPayload() {
			sum += uint64(b)
		}
		ack := &shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Ack{Ack: &shardv1.Ack{
			WorkId: d.GetWorkId(), IdempotencyStep: d.GetIdempotencyStep(), ExecutionNanos: sum,
		}}}
		if err := stream.Send(ack); err != nil {
			return err
		}
	}
}

func TestOverGRPC(t *testing.T) {
	pool := bufpool.New(bufpool.Tracking())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(Codec{Pool: pool}), experimental.BufferPool(pool))
	shardv1.RegisterShardRuntimeServer(srv, echoServer{})
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := shardv1.NewShardRuntimeClient(conn).Session(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// 64 elements fit one HTTP/2 frame; 1 Mi elements span many.
	for _, hidden := range []int{64, 1 << 20} {
		wire, payload := decodeStepWire(t, hidden)
		var req shardv1.SessionRequest
		if err := req.UnmarshalVT(wire); err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&req); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var want uint64
		for _, b := range payload {
			want += uint64(b)
		}
		if ack := resp.GetAck(); ack.GetWorkId() != "w-7" || ack.GetExecutionNanos() != want {
			t.Fatalf("hidden %d: ack %v, want byte sum %d", hidden, ack, want)
		}
	}
	stream.CloseSend()
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("want EOF, got %v", err)
	}
}

// A reused Inbound must not let a previous decode step leak into a frame that
// carries a different kind, or none.
func TestInboundReuseAcrossKinds(t *testing.T) {
	pool := bufpooltest.New(t)
	codec := Codec{Pool: pool}
	decodeWire, _ := decodeStepWire(t, 1024)
	fc, _ := (&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_FlowControl{
		FlowControl: &shardv1.FlowControl{CreditsGranted: 3}}}).MarshalVT()
	var in Inbound
	for i, wire := range [][]byte{decodeWire, {}, decodeWire, fc, decodeWire, decodeWire} {
		data := mem.BufferSlice{mem.Copy(wire, pool)}
		if len(wire) == 0 {
			data = nil
		}
		if err := codec.Unmarshal(data, &in); err != nil {
			t.Fatal(err)
		}
		data.Free()
		switch {
		case len(wire) == 0:
			if in.Msg.GetKind() != nil {
				t.Fatalf("frame %d: empty frame decoded as %T", i, in.Msg.GetKind())
			}
		case &wire[0] == &fc[0]:
			if in.Msg.GetFlowControl().GetCreditsGranted() != 3 {
				t.Fatalf("frame %d: flow control lost", i)
			}
		default:
			d := in.Msg.GetDecode()
			if d.GetIdempotencyStep() != 7 || len(d.GetTensor().GetShape()) != 3 || len(d.GetTensor().GetFragments()) != 1 {
				t.Fatalf("frame %d: decode step decoded wrong: %v", i, d)
			}
		}
		in.Release()
	}
}

// TestReleaseScrubsAliases: pooled parts must not keep pointing into the
// released receive buffer (ResetVT keeps a bytes field's capacity, and a later
// safe UnmarshalVT appends into it).
func TestReleaseScrubsAliases(t *testing.T) {
	pool := bufpooltest.New(t)
	wire, _ := decodeStepWire(t, 1024)
	req := &shardv1.SessionRequest{}
	if err := req.UnmarshalVT(wire); err != nil {
		t.Fatal(err)
	}
	req.GetDecode().Tensor.Checksum = &shardv1.Checksum{Algorithm: 2, Value: []byte{1, 2, 3, 4}}
	wire, _ = req.MarshalVT()
	data := mem.BufferSlice{mem.Copy(wire, pool)}
	var in Inbound
	if err := (Codec{Pool: pool}).Unmarshal(data, &in); err != nil {
		t.Fatal(err)
	}
	data.Free()
	frag := in.Msg.GetDecode().GetTensor().GetFragments()[0]
	sum := in.Msg.GetDecode().GetTensor().GetChecksum()
	if len(frag.Payload) == 0 || len(sum.Value) != 4 {
		t.Fatal("setup: fields empty")
	}
	in.Release()
	if cap(frag.Payload) != 0 || cap(sum.Value) != 0 {
		t.Fatalf("released parts still alias the receive buffer: payload cap %d, checksum cap %d", cap(frag.Payload), cap(sum.Value))
	}
}

// TestResponseAliasesAndScrubs: a last hop's result spans several frames,
// so it is materialized once and the payload aliases that copy; Release
// returns the buffer and leaves no pooled part pointing into it.
func TestResponseAliasesAndScrubs(t *testing.T) {
	pool := bufpooltest.New(t)
	payload := make([]byte, 40000)
	for i := range payload {
		payload[i] = byte(i * 13)
	}
	resp := &shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Chunk{Chunk: &shardv1.ActivationChunk{
		Envelope: &shardv1.Envelope{WorkId: "rs-1/9", IdempotencyStep: 9},
		Bundle: &shardv1.TensorBundle{BundleVersion: 1, Tensors: []*shardv1.NamedTensor{{
			Name: "logits", Shape: []int64{1, 10000}, Dtype: shardv1.DType_DTYPE_FLOAT32, TotalBytes: uint64(len(payload)),
			Checksum:  &shardv1.Checksum{Algorithm: shardv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, Value: []byte{1, 2, 3, 4}},
			Fragments: []*shardv1.TensorFragment{{FragmentCount: 1, Payload: payload}},
		}}},
	}}}
	wire, err := resp.MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	var data mem.BufferSlice
	for off := 0; off < len(wire); off += 16384 {
		data = append(data, mem.Copy(wire[off:min(len(wire), off+16384)], pool))
	}
	var r Response
	if err := (Codec{Pool: pool}).Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	data.Free()
	nt := r.Msg.GetChunk().GetBundle().GetTensors()[0]
	frag, sum := nt.GetFragments()[0], nt.GetChecksum()
	if !bytes.Equal(frag.Payload, payload) || r.Msg.GetChunk().GetEnvelope().GetWorkId() != "rs-1/9" {
		t.Fatal("decoded response differs")
	}
	if !within(frag.Payload, r.buf.ReadOnlyData()) {
		t.Fatal("payload was copied out of the materialized buffer")
	}
	if pool.Outstanding() != 1 {
		t.Fatalf("outstanding %d, want the materialized buffer only", pool.Outstanding())
	}
	r.Release()
	if cap(frag.Payload) != 0 || cap(sum.Value) != 0 {
		t.Fatalf("released parts still alias the receive buffer: payload cap %d, checksum cap %d", cap(frag.Payload), cap(sum.Value))
	}
	if pool.Outstanding() != 0 {
		t.Fatalf("outstanding %d after Release", pool.Outstanding())
	}
	r.Release() // idempotent

	// Reusable: an Ack into the same Response.
	ack, _ := (&shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Ack{Ack: &shardv1.Ack{WorkId: "w", IdempotencyStep: 3}}}).MarshalVT()
	data = mem.BufferSlice{mem.Copy(ack, pool)}
	if err := (Codec{Pool: pool}).Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	data.Free()
	if r.Msg.GetAck().GetIdempotencyStep() != 3 || r.Msg.GetChunk() != nil {
		t.Fatalf("reused Response decoded %v", &r.Msg)
	}
	r.Release()
}
