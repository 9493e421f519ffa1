package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"runtime"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/race"
	"github.com/meshnet/shardd/internal/tensorname"
	"github.com/meshnet/shardd/stages/decode"
	"github.com/meshnet/shardd/stages/frameout"
)

// memStream is a Session stream held in memory, in place of gRPC's
// transport: RecvMsg hands the project's codec the bytes of a message
// marshalled beforehand (as gRPC hands it a received frame), and Send
// marshals each response into one reused buffer (as gRPC serializes it
// before Send returns). Neither allocates, so what a test counts around it
// is the worker's own: the codec's decode, the receive stages, the stream,
// the scheduler and its driver, the framing of the reply.
type memStream struct {
	ctx  context.Context
	reqs chan mem.BufferSlice // closed: the initiator closed its side
	out  []byte
	// What came back, for the test to check.
	acks     atomic.Uint64 // the last acknowledged step
	chunks   atomic.Int64  // result chunks
	statuses atomic.Int64  // refusals
	acked    chan struct{} // one per Ack
}

func newMemStream(ctx context.Context) *memStream {
	return &memStream{ctx: ctx, reqs: make(chan mem.BufferSlice, 4), out: make([]byte, 0, 64<<10), acked: make(chan struct{}, 64)}
}

func (m *memStream) Context() context.Context     { return m.ctx }
func (m *memStream) SetHeader(metadata.MD) error  { return nil }
func (m *memStream) SendHeader(metadata.MD) error { return nil }
func (m *memStream) SetTrailer(metadata.MD)       {}

func (m *memStream) Recv() (*shardv1.SessionRequest, error) {
	panic("the worker receives with RecvMsg")
}

func (m *memStream) RecvMsg(v any) error {
	select {
	case bs, ok := <-m.reqs:
		if !ok {
			return io.EOF
		}
		return decode.Codec{Pool: bufpool.Default}.Unmarshal(bs, v)
	case <-m.ctx.Done():
		return m.ctx.Err()
	}
}

func (m *memStream) Send(r *shardv1.SessionResponse) error { return m.SendMsg(r) }

func (m *memStream) SendMsg(v any) error {
	var r *shardv1.SessionResponse
	switch x := v.(type) {
	case *shardv1.SessionResponse:
		r = x
	case *decode.Spliced:
		r = x.Msg
	default:
		return fmt.Errorf("send %T", v)
	}
	n := r.SizeVT()
	if cap(m.out) < n {
		m.out = make([]byte, n)
	}
	if _, err := r.MarshalToSizedBufferVT(m.out[:n]); err != nil {
		return err
	}
	switch k := r.Kind.(type) {
	case *shardv1.SessionResponse_Chunk:
		m.chunks.Add(1)
	case *shardv1.SessionResponse_Ack:
		m.acks.Store(k.Ack.IdempotencyStep)
		m.acked <- struct{}{}
	case *shardv1.SessionResponse_Status:
		m.statuses.Add(1)
		m.acked <- struct{}{}
	}
	return nil
}

// wire marshals req as it arrives from a head.
func wire(t testing.TB, req *shardv1.SessionRequest) mem.BufferSlice {
	b, err := req.MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}
}

// A decode step costs the worker no allocation, from the received bytes
// to the serialized reply: a session on a first shard (token ids in), a
// middle one (bf16 hidden states with CRC32C in and out, as a head sends
// them) and a last one (logits out) decodes step after step through
// Session over memStream, the forward on the fake backend (which then
// records nothing). gRPC's transport, which BenchmarkDecodeHop counts with
// the rest, is the part left out.
func TestSessionDecodeStepAllocs(t *testing.T) {
	for _, shard := range []struct {
		name        string
		first, last bool
	}{{"first", true, false}, {"middle", false, false}, {"last", false, true}} {
		t.Run(shard.name, func(t *testing.T) { sessionDecodeStepAllocs(t, shard.first, shard.last) })
	}
}

func sessionDecodeStepAllocs(t *testing.T, first, last bool) {
	fb := newFake(first, last)
	fb.Quiet = true
	e := New(Config{EvictGrace: -1}, fb, fakeMeta(), quietLog())
	defer e.Close()
	id := e.Identity()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ms := newMemStream(ctx)
	served := make(chan error, 1)
	go func() { served <- e.Session(ms) }()
	defer func() {
		close(ms.reqs)
		if err := <-served; err != nil {
			t.Errorf("session: %v", err)
		}
	}()

	const session, prompt = "alloc", 4
	ms.reqs <- wire(t, &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Open{Open: &shardv1.SessionOpen{
		SchemaVersion: shardv1.SchemaVersion_SCHEMA_VERSION_1, RouteSessionId: session, RouteEpoch: 1,
		Fingerprint: id.Fingerprint, ShardRange: id.Range,
	}}})
	framer := frameout.New(bufpool.Default)
	defer framer.Close()
	input := func(rows int) *shardv1.NamedTensor {
		nt := &shardv1.NamedTensor{}
		if first {
			body := make([]byte, 4*rows)
			for i := range rows {
				binary.LittleEndian.PutUint32(body[4*i:], uint32(i+3)%uint32(fb.Shape.Vocab))
			}
			framer.Frame(nt, tensorname.InputIDs, []int64{int64(rows)}, shardv1.DType_DTYPE_INT32, body, frameout.Options{})
			return nt
		}
		body := make([]byte, 2*rows*fb.Shape.Hidden)
		for i := range body {
			body[i] = byte(i*7 + rows)
		}
		framer.Frame(nt, tensorname.Hidden, []int64{int64(rows), int64(fb.Shape.Hidden)}, shardv1.DType_DTYPE_BFLOAT16, body, frameout.Options{})
		return nt
	}
	ms.reqs <- wire(t, &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Chunk{Chunk: &shardv1.ActivationChunk{
		Envelope: &shardv1.Envelope{
			SchemaVersion: shardv1.SchemaVersion_SCHEMA_VERSION_1, WorkId: "alloc/1", RouteSessionId: session, RouteEpoch: 1,
			Fingerprint: id.Fingerprint, ShardRange: id.Range, Phase: shardv1.Phase_PHASE_PREFILL,
			Position: &shardv1.PositionSpan{TokenCount: prompt}, IdempotencyStep: 1,
			CacheExpectation: &shardv1.CacheExpectation{Mode: shardv1.CacheMode_CACHE_MODE_PREFILL},
		},
		Bundle: &shardv1.TensorBundle{BundleVersion: 1, Tensors: []*shardv1.NamedTensor{input(prompt)}},
	}}})
	<-ms.acked

	// Decode steps 2.. at positions prompt.., marshalled beforehand.
	const warm, rounds = 20, 100                      // within the fake's context of 256
	steps := make([]mem.BufferSlice, warm+2*rounds+1) // AllocsPerRun runs rounds+1
	for i := range steps {
		pos := uint64(prompt + i)
		steps[i] = wire(t, &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Decode{Decode: &shardv1.DecodeStep{
			IdempotencyStep: uint64(2 + i), Position: pos, ExpectedPastLen: pos,
			Tensor: input(1), WorkId: fmt.Sprintf("alloc/%d", 2+i),
		}}})
	}
	next := 0
	step := func() {
		ms.reqs <- steps[next]
		next++
		<-ms.acked
	}
	for range warm {
		step()
	}
	perStep := testing.AllocsPerRun(rounds, step)
	fewest := fewestAllocs(rounds, step)
	if n := ms.statuses.Load(); n != 0 {
		t.Fatalf("%d steps refused", n)
	}
	if got, want := ms.acks.Load(), uint64(1+next); got != want {
		t.Fatalf("last ack for step %d, want %d", got, want)
	}
	if got, want := ms.chunks.Load(), int64(1+next); got != want {
		t.Fatalf("%d result chunks, want %d", got, want)
	}
	t.Logf("%.2f allocations per decode step, %d in the step that made fewest", perStep, fewest)
	// 0 in a plain build (the code before this test made 3: the work
	// item, its id and its segment list). The ownership checks (-tags
	// invariants) never reuse a bufpool.Buffer, so that a stale pointer
	// fails at once: 1 a step. With them, and under the race detector
	// (whose sync.Pool drops a random share of what it is given), only
	// the step that made fewest is held to the bound: an allocation this
	// code made on every step would show in each.
	if !bufpool.Invariants && !race.Enabled && perStep > 0 {
		t.Fatalf("%.2f allocations per decode step, want 0", perStep)
	}
	var limit uint64
	if bufpool.Invariants {
		limit = 1
	}
	if fewest > limit {
		t.Fatalf("%d allocations in the decode step that made fewest, want at most %d", fewest, limit)
	}
}

// fewestAllocs runs step rounds times and returns the fewest heap
// allocations (the whole process's, as testing.AllocsPerRun counts them)
// that one run made.
func fewestAllocs(rounds int, step func()) uint64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var before, after runtime.MemStats
	fewest := uint64(math.MaxUint64)
	for range rounds {
		runtime.ReadMemStats(&before)
		step()
		runtime.ReadMemStats(&after)
		fewest = min(fewest, after.Mallocs-before.Mallocs)
	}
	return fewest
}
