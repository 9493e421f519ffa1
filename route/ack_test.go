package route

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/stages/dtype"
	"github.com/meshnet/shardd/stages/frameout"
)

// ackWorker is a one-hop test double that owns every layer: it answers each
// unit of work with logits whose largest entry is the next token id, then an
// Ack reporting 1 µs of execution; the second step of every stream is marked
// a duplicate. It grants the window it was made with.
type ackWorker struct {
	shardv1.UnimplementedShardRuntimeServer
	window uint32
	vocab  int
	// mangle, when set, replaces the output tensors of the given step
	// (counted from 1 per stream) with what it returns (nil: unchanged).
	mangle func(step int, framer *frameout.Framer, logits []float32) []*shardv1.NamedTensor
}

func (w *ackWorker) GetCapability(context.Context, *shardv1.CapabilityRequest) (*shardv1.CapabilityReport, error) {
	return &shardv1.CapabilityReport{Validated: true, Fingerprint: &shardv1.Fingerprint{ModelArtifactDigest: "m", RuntimeRecipeDigest: "r"},
		ShardRange: &shardv1.ShardRange{StartLayer: 0, EndLayer: 4}}, nil
}

func (w *ackWorker) Session(ss grpc.BidiStreamingServer[shardv1.SessionRequest, shardv1.SessionResponse]) error {
	framer := frameout.New(bufpool.Default)
	defer framer.Close()
	steps := 0
	for {
		req, err := ss.Recv()
		if err != nil {
			return nil
		}
		var step, first uint64
		var n uint32
		switch k := req.Kind.(type) {
		case *shardv1.SessionRequest_Open:
			if err := ss.Send(&shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Accepted{Accepted: &shardv1.SessionAccepted{
				SchemaVersion: 1, FlowControl: &shardv1.FlowControl{CreditsGranted: w.window, MaxInflightChunks: w.window, MaxPrefillChunkTokens: 64},
			}}}); err != nil {
				return err
			}
			continue
		case *shardv1.SessionRequest_Decode:
			step, first, n = k.Decode.IdempotencyStep, k.Decode.Position, 1
		case *shardv1.SessionRequest_Chunk:
			env := k.Chunk.Envelope
			step, first, n = env.IdempotencyStep, env.Position.FirstPosition, env.Position.TokenCount
		default:
			continue
		}
		steps++
		logits := make([]float32, w.vocab)
		logits[(first+uint64(n))%uint64(w.vocab)] = 1
		nt := &shardv1.NamedTensor{}
		framer.Frame(nt, "logits", []int64{1, int64(w.vocab)}, shardv1.DType_DTYPE_FLOAT32, dtype.AppendF32Bytes(nil, logits), frameout.Options{})
		out := []*shardv1.NamedTensor{nt}
		if w.mangle != nil {
			if m := w.mangle(steps, framer, logits); m != nil {
				out = m
			}
		}
		if err := ss.Send(&shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Chunk{Chunk: &shardv1.ActivationChunk{
			Envelope: &shardv1.Envelope{IdempotencyStep: step},
			Bundle:   &shardv1.TensorBundle{BundleVersion: 1, Tensors: out},
		}}}); err != nil {
			return err
		}
		if err := ss.Send(&shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Ack{Ack: &shardv1.Ack{
			IdempotencyStep: step, ExecutionNanos: 1000, Duplicate: steps == 2,
		}}}); err != nil {
			return err
		}
	}
}

// TestAcksReadLate: with a window of two the head reads each Ack at the
// next exchange, with a window of one at once; either way the tokens are the
// same and every step's Ack is counted, the last one included.
func TestAcksReadLate(t *testing.T) {
	for _, window := range []uint32{1, 2} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		shardv1.RegisterShardRuntimeServer(srv, &ackWorker{window: window, vocab: 50})
		go srv.Serve(lis)
		r, err := Dial(context.Background(), []string{lis.Addr().String()}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		var toks []int32
		st, err := r.Generate(context.Background(), Request{Prompt: []int32{3, 4, 5}, MaxTokens: 6}, func(tok int32) error {
			toks = append(toks, tok)
			return nil
		})
		r.Close()
		srv.Stop()
		if err != nil {
			t.Fatalf("window %d: %v", window, err)
		}
		// Position p's logits point at p+1: prompt of 3, so 3, 4, ... 8.
		for i, tok := range toks {
			if tok != int32(3+i) {
				t.Fatalf("window %d: tokens %v", window, toks)
			}
		}
		h := st.Hops[0]
		if h.Calls != 6 || h.Exec != 6*1000 || st.DuplicateAcks != 1 {
			t.Fatalf("window %d: %d calls, exec %v, %d duplicate Acks; want 6, 6µs, 1", window, h.Calls, h.Exec, st.DuplicateAcks)
		}
	}
}
