package engine

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/internal/tensorname"
	"github.com/meshnet/shardd/relay"
	"github.com/meshnet/shardd/stages/frameout"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if modelDir != "" {
		os.RemoveAll(modelDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

var (
	modelOnce sync.Once
	modelDir  string
	modelErr  error
)

// tinyFiles returns the tiny model and its 2-way split, made once per run.
func tinyFiles(t testing.TB) (whole string, shards []string) {
	t.Helper()
	modelOnce.Do(func() {
		if modelDir, modelErr = os.MkdirTemp("", "shardd-engine-test-"); modelErr != nil {
			return
		}
		p := filepath.Join(modelDir, "tiny.gguf")
		if modelErr = gguf.Generate(p, gguf.Presets["tiny"]); modelErr == nil {
			_, modelErr = gguf.Split(p, gguf.EvenRanges(6, 2), modelDir, nil)
		}
	})
	if modelErr != nil {
		t.Fatal(modelErr)
	}
	return filepath.Join(modelDir, "tiny.gguf"), []string{
		filepath.Join(modelDir, "tiny.0-3.gguf"), filepath.Join(modelDir, "tiny.3-6.gguf"),
	}
}

// worker is one engine behind a real gRPC server on loopback.
type worker struct {
	eng    *Engine
	client shardv1.ShardRuntimeClient
	id     Identity
	info   backend.Info
	// transport is "grpc" for a direct hop, "relay" for one through a
	// relay (viaRelay), whose relay is then set.
	transport string
	relay     *relay.Relay
}

func quietLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// startWorker serves be through an engine; everything stops at cleanup.
func startWorker(t testing.TB, be backend.Backend, meta gguf.Meta, cfg Config) *worker {
	t.Helper()
	if cfg.EvictGrace == 0 {
		cfg.EvictGrace = -1 // scenarios evict at once unless they test the grace
	}
	eng := New(cfg, be, meta, quietLog())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(eng.ServerOptions()...)
	shardv1.RegisterShardRuntimeServer(srv, eng)
	served := make(chan struct{})
	go func() { srv.Serve(lis); close(served) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		<-served
		eng.Close()
		be.Close()
	})
	return &worker{eng: eng, client: shardv1.NewShardRuntimeClient(conn), id: eng.Identity(), info: be.Info(), transport: "grpc"}
}

// startLlama serves a GGUF with the real backend.
func startLlama(t testing.TB, path string, cfg Config) *worker {
	t.Helper()
	meta, err := gguf.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	seqs := cfg.MaxSessions
	if seqs == 0 {
		seqs = 4
	}
	be, err := llamacpp.OpenMeta(llamacpp.Config{Path: path, Threads: 1, MaxSeqs: seqs + 1, CtxTokens: 256, MaxBatch: 64}, meta)
	if err != nil {
		t.Fatal(err)
	}
	return startWorker(t, be, meta, cfg)
}

// session is a test client's stream to one worker.
type session struct {
	t      testing.TB
	w      *worker
	stream grpc.BidiStreamingClient[shardv1.SessionRequest, shardv1.SessionResponse]
	cancel context.CancelFunc
	id     string
	epoch  uint64
	framer *frameout.Framer
}

// dial opens a stream and sends open (nil: a valid open for id).
func (w *worker) dial(t testing.TB, id string, epoch uint64, open *shardv1.SessionOpen) (*session, *shardv1.SessionResponse) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := w.client.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := &session{t: t, w: w, stream: stream, cancel: cancel, id: id, epoch: epoch, framer: frameout.New(bufpool.Default)}
	t.Cleanup(func() { s.close() })
	if open == nil {
		open = w.openMsg(id, epoch)
	}
	s.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Open{Open: open}})
	return s, s.recv()
}

func (w *worker) openMsg(id string, epoch uint64) *shardv1.SessionOpen {
	return &shardv1.SessionOpen{
		SchemaVersion: shardv1.SchemaVersion_SCHEMA_VERSION_1, RouteSessionId: id, RouteEpoch: epoch,
		Fingerprint: w.id.Fingerprint, ShardRange: w.id.Range,
		AcceptedCompression: []shardv1.Compression{shardv1.Compression_COMPRESSION_ZSTD},
	}
}

// open dials and requires acceptance.
func (w *worker) open(t testing.TB, id string, epoch uint64) *session {
	t.Helper()
	s, resp := w.dial(t, id, epoch, nil)
	if resp.GetAccepted() == nil {
		t.Fatalf("open refused: %v", resp)
	}
	return s
}

func (s *session) close() {
	if s.t.Failed() {
		// A failed test may have left a forward held: end the stream now
		// instead of waiting for the worker to end it.
		s.cancel()
	}
	s.stream.CloseSend()
	for {
		if _, err := s.stream.Recv(); err != nil {
			break
		}
	}
	s.cancel()
	s.framer.Close()
}

func (s *session) send(req *shardv1.SessionRequest) {
	s.t.Helper()
	if err := s.stream.Send(req); err != nil {
		s.t.Fatalf("send: %v", err)
	}
}

func (s *session) recv() *shardv1.SessionResponse {
	s.t.Helper()
	resp, err := s.stream.Recv()
	if err != nil {
		s.t.Fatalf("recv: %v", err)
	}
	return resp
}

// envelope builds a valid envelope for this session.
func (s *session) envelope(step uint64, mode shardv1.CacheMode, first, n int, expected uint64) *shardv1.Envelope {
	phase := shardv1.Phase_PHASE_PREFILL
	if mode == shardv1.CacheMode_CACHE_MODE_DECODE {
		phase = shardv1.Phase_PHASE_DECODE
	}
	return &shardv1.Envelope{
		SchemaVersion: shardv1.SchemaVersion_SCHEMA_VERSION_1, WorkId: "w", RouteSessionId: s.id, RouteEpoch: s.epoch,
		Fingerprint: s.w.id.Fingerprint, ShardRange: s.w.id.Range, Phase: phase,
		Position: &shardv1.PositionSpan{FirstPosition: uint64(first), TokenCount: uint32(n)}, IdempotencyStep: step,
		CacheExpectation: &shardv1.CacheExpectation{Mode: mode, ExpectedPastLen: expected},
	}
}

// tokensTensor frames token ids as input_ids.
func (s *session) tokensTensor(ids []int32) *shardv1.NamedTensor {
	b := make([]byte, 0, 4*len(ids))
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint32(b, uint32(id))
	}
	nt := &shardv1.NamedTensor{}
	s.framer.Frame(nt, tensorname.InputIDs, []int64{int64(len(ids))}, shardv1.DType_DTYPE_INT32, b, frameout.Options{})
	return nt
}

// hiddenTensor frames a body already in the wire dtype.
func (s *session) hiddenTensor(body []byte, tokens int, dt shardv1.DType) *shardv1.NamedTensor {
	nt := &shardv1.NamedTensor{}
	s.framer.Frame(nt, tensorname.Hidden, []int64{int64(tokens), int64(s.w.info.Hidden)}, dt, body, frameout.Options{})
	return nt
}

// chunk sends an ActivationChunk.
func (s *session) chunk(env *shardv1.Envelope, tensors ...*shardv1.NamedTensor) {
	s.t.Helper()
	s.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Chunk{Chunk: &shardv1.ActivationChunk{
		Envelope: env, Bundle: &shardv1.TensorBundle{BundleVersion: 1, Tensors: tensors},
	}}})
}

// outcome is what a worker answered for one unit of work.
type outcome struct {
	chunk  *shardv1.ActivationChunk
	ack    *shardv1.Ack
	status *shardv1.ShardStatus
}

// result reads the answer to one unit of work: a chunk and its ack, or a
// status.
func (s *session) result() outcome {
	s.t.Helper()
	var o outcome
	for {
		resp := s.recv()
		switch k := resp.Kind.(type) {
		case *shardv1.SessionResponse_Chunk:
			o.chunk = k.Chunk
		case *shardv1.SessionResponse_Ack:
			o.ack = k.Ack
			return o
		case *shardv1.SessionResponse_Status:
			o.status = k.Status
			return o
		default:
			s.t.Fatalf("unexpected %T", resp.Kind)
		}
	}
}

// body returns the first tensor of a result chunk as bytes.
func (o outcome) body(t testing.TB) []byte {
	t.Helper()
	if o.chunk == nil {
		t.Fatalf("no result chunk (status %v)", o.status)
	}
	nt := o.chunk.Bundle.Tensors[0]
	var out []byte
	for _, f := range nt.Fragments {
		out = append(out, f.Payload...)
	}
	if nt.Compression != shardv1.Compression_COMPRESSION_NONE {
		t.Fatalf("test helper does not decompress")
	}
	return out
}

func f32sOf(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func code(o outcome) shardv1.ErrorCode {
	if o.status == nil {
		return shardv1.ErrorCode_ERROR_CODE_UNSPECIFIED
	}
	return o.status.Error.GetCode()
}

// waitUntil spins on cond (a read of state the test cannot be signalled
// about) until it holds or a deadline passes.
func waitUntil(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		runtime.Gosched()
	}
}

// waitFor polls cond on the scheduler's own signal: each check runs after
// the scheduler has processed everything before it.
func waitFor(t testing.TB, e *Engine, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var ok bool
		e.do(context.Background(), func() { ok = cond() })
		if ok {
			return
		}
	}
	t.Fatal("condition not reached")
}
