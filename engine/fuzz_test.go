package engine

import (
	"context"
	"encoding/binary"
	"io"
	"testing"
	"time"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/tensorname"
)

// FuzzSession feeds the Session handler arbitrary request sequences over a
// real gRPC stream (one worker with a fake backend for the whole run). The
// input is a sequence of length-prefixed (2 bytes, little-endian)
// serialized SessionRequests; pieces that do not parse are sent as an
// empty request. Every stream ends with every request answered or the
// stream closed, the worker holds no queued work afterwards, and it still
// serves a well-formed session: bad input never takes it down.
func FuzzSession(f *testing.F) {
	w := startWorker(f, newFake(true, true), fakeMeta(), Config{MaxSessions: 4, MaxQueue: 64})
	enc := func(msgs ...*shardv1.SessionRequest) []byte {
		var out []byte
		for _, m := range msgs {
			b, _ := m.MarshalVT()
			out = binary.LittleEndian.AppendUint16(out, uint16(len(b)))
			out = append(out, b...)
		}
		return out
	}
	s := &session{w: w, id: "fz", epoch: 1}
	ids := func(v ...int32) *shardv1.NamedTensor {
		b := make([]byte, 0, 4*len(v))
		for _, x := range v {
			b = binary.LittleEndian.AppendUint32(b, uint32(x))
		}
		return &shardv1.NamedTensor{Name: tensorname.InputIDs, Shape: []int64{int64(len(v))}, Dtype: shardv1.DType_DTYPE_INT32,
			TotalBytes: uint64(len(b)), Fragments: []*shardv1.TensorFragment{{FragmentCount: 1, Payload: b}}}
	}
	open := &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Open{Open: w.openMsg("fz", 1)}}
	chunk := &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Chunk{Chunk: &shardv1.ActivationChunk{
		Envelope: s.envelope(1, prefill, 0, 2, 0), Bundle: &shardv1.TensorBundle{BundleVersion: 1, Tensors: []*shardv1.NamedTensor{ids(1, 2)}}}}}
	step := &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Decode{Decode: &shardv1.DecodeStep{
		IdempotencyStep: 2, Position: 2, ExpectedPastLen: 2, Tensor: ids(3), WorkId: "d"}}}
	cancel := &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Cancel{Cancel: &shardv1.CancelSignal{RouteSessionId: "fz", RouteEpoch: 1}}}
	release := &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Release{Release: &shardv1.ReleaseSignal{RouteSessionId: "fz", RouteEpoch: 1}}}
	f.Add(enc(open, chunk, step, release))
	f.Add(enc(open, chunk, step, step, cancel, chunk))
	f.Add(enc(open, step, chunk))
	f.Add(enc(chunk, open))
	f.Add(enc(open, &shardv1.SessionRequest{}, open))

	f.Fuzz(func(t *testing.T, in []byte) {
		ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		stream, err := w.client.Session(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for len(in) >= 2 {
			n := int(binary.LittleEndian.Uint16(in))
			in = in[2:]
			n = min(n, len(in))
			m := &shardv1.SessionRequest{}
			if m.UnmarshalVT(in[:n]) != nil {
				m = &shardv1.SessionRequest{}
			}
			in = in[n:]
			if stream.Send(m) != nil {
				break // the worker ended the stream (a refused open)
			}
		}
		stream.CloseSend()
		for {
			if _, err := stream.Recv(); err != nil {
				if err != io.EOF && ctx.Err() != nil {
					t.Fatalf("the stream did not end: %v", err)
				}
				break
			}
		}
		stop()
		waitUntil(t, func() bool { return w.eng.queued.Load() == 0 })
		// Still serving: a well-formed session prefills.
		g := w.open(t, "fz-check", 1)
		defer g.close()
		if o := g.prefillTokens(1, 1, 2); o.ack == nil {
			t.Fatalf("a well-formed session after the fuzzed stream: %v", o.status)
		}
		g.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Release{Release: &shardv1.ReleaseSignal{RouteSessionId: "fz-check", RouteEpoch: 1}}})
	})
}
