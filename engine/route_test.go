package engine

import (
	"math"
	"testing"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/backend/llamacpp"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/tensorname"
	"github.com/meshnet/shardd/verify"
)

// route is a test head driving two workers (first and last shard) by hand.
type route struct {
	t      *testing.T
	a, b   *session
	pos    int
	step   uint64
	hidden int
}

// forward sends a chunk of token ids through both shards and returns the
// last shard's logits. The first shard's output is passed on unchanged.
func (r *route) forward(mode shardv1.CacheMode, ids []int32) []float32 {
	r.t.Helper()
	r.step++
	first, n := r.pos, len(ids)
	expected := uint64(0)
	if mode == shardv1.CacheMode_CACHE_MODE_DECODE {
		expected = uint64(first)
	}
	r.a.chunk(r.a.envelope(r.step, mode, first, n, expected), r.a.tokensTensor(ids))
	oa := r.a.result()
	if oa.ack == nil {
		r.t.Fatalf("first shard: %v", oa.status)
	}
	hidden := oa.body(r.t)
	dt := oa.chunk.Bundle.Tensors[0].Dtype
	r.b.chunk(r.b.envelope(r.step, mode, first, n, expected), r.b.hiddenTensor(hidden, n, dt))
	ob := r.b.result()
	if ob.ack == nil {
		r.t.Fatalf("last shard: %v", ob.status)
	}
	r.pos += n
	return f32sOf(ob.body(r.t))
}

// reference computes the unsplit model's logits for the last token of each
// call, in process.
type reference struct {
	chain *verify.Chain
	pos   int
}

func (rf *reference) forward(t *testing.T, ids []int32) []float32 {
	t.Helper()
	rows := make([]verify.Row, len(ids))
	for i, id := range ids {
		rows[i] = verify.Row{Seq: 0, Pos: rf.pos + i, Token: id, Output: i == len(ids)-1}
	}
	rf.pos += len(ids)
	out, err := rf.chain.Forward(rows)
	if err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), out...)
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestRouteStateSurvivesRetries: a duplicated step, a dropped-then-retried
// step and a stale-epoch chunk leave the KV state exactly right: afterwards
// the route's logits still equal the unsplit model's, bit for bit (the
// workers use the exact f32 boundary).
func TestRouteStateSurvivesRetries(t *testing.T) {
	whole, shards := tinyFiles(t)
	cfg := Config{Boundary: shardv1.DType_DTYPE_FLOAT32}
	wa, wb := startLlama(t, shards[0], cfg), startLlama(t, shards[1], cfg)
	full, err := llamacpp.Open(llamacpp.Config{Path: whole, Threads: 1, MaxSeqs: 1, CtxTokens: 256, MaxBatch: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	chain, err := verify.NewChain([]backend.Backend{full}, verify.F32)
	if err != nil {
		t.Fatal(err)
	}
	defer chain.Close()
	ref := &reference{chain: chain}
	r := &route{t: t, a: wa.open(t, "route", 3), b: wb.open(t, "route", 3)}

	check := func(what string, got, want []float32) {
		t.Helper()
		if !sameBits(got, want) {
			t.Fatalf("%s: route logits differ from the unsplit model", what)
		}
	}
	prompt := []int32{1, 17, 42, 7, 99}
	check("prefill", r.forward(prefill, prompt), ref.forward(t, prompt))
	check("decode 1", r.forward(decodeM, []int32{11}), ref.forward(t, []int32{11}))

	// Duplicate: resend the last step to both shards. Each acknowledges it
	// as a duplicate with the original result, and nothing is re-applied.
	for _, s := range []*session{r.a, r.b} {
		var nt *shardv1.NamedTensor
		if s == r.a {
			nt = s.tokensTensor([]int32{11})
		} else {
			nt = s.hiddenTensor(make([]byte, 4*128), 1, shardv1.DType_DTYPE_FLOAT32)
		}
		s.chunk(s.envelope(r.step, decodeM, r.pos-1, 1, uint64(r.pos-1)), nt)
		o := s.result()
		if o.ack == nil || !o.ack.Duplicate || o.chunk == nil || o.ack.CacheResult.PastLen != uint64(r.pos) {
			t.Fatalf("duplicate: ack %v status %v", o.ack, o.status)
		}
	}
	check("after duplicate", r.forward(decodeM, []int32{12}), ref.forward(t, []int32{12}))

	// Dropped then retried: the first shard's answer is lost on the way to
	// the last shard; the head retries the same step on the first shard and
	// gets the same hidden states back.
	r.step++
	r.a.chunk(r.a.envelope(r.step, decodeM, r.pos, 1, uint64(r.pos)), r.a.tokensTensor([]int32{13}))
	lost := r.a.result()
	r.a.chunk(r.a.envelope(r.step, decodeM, r.pos, 1, uint64(r.pos)), r.a.tokensTensor([]int32{13}))
	retried := r.a.result()
	if !retried.ack.GetDuplicate() || string(retried.body(t)) != string(lost.body(t)) {
		t.Fatal("a retried step must return the original result")
	}
	r.b.chunk(r.b.envelope(r.step, decodeM, r.pos, 1, uint64(r.pos)), r.b.hiddenTensor(retried.body(t), 1, shardv1.DType_DTYPE_FLOAT32))
	got := f32sOf(r.b.result().body(t))
	r.pos++
	check("dropped then retried", got, ref.forward(t, []int32{13}))

	// A stale epoch is refused without touching the state.
	env := r.a.envelope(r.step+1, decodeM, r.pos, 1, uint64(r.pos))
	env.RouteEpoch = 2
	r.a.chunk(env, r.a.tokensTensor([]int32{14}))
	if o := r.a.result(); code(o) != cStale {
		t.Fatalf("stale epoch: %v", o.status)
	}
	check("after stale epoch", r.forward(decodeM, []int32{14}), ref.forward(t, []int32{14}))

	// The DecodeStep fast path computes the same as a full chunk.
	r.step++
	oa := r.a.decodeToken(r.step, r.pos, 15)
	if oa.ack == nil {
		t.Fatalf("fast path: %v", oa.status)
	}
	r.b.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Decode{Decode: &shardv1.DecodeStep{
		IdempotencyStep: r.step, Position: uint64(r.pos), ExpectedPastLen: uint64(r.pos),
		Tensor: r.b.hiddenTensor(oa.body(t), 1, shardv1.DType_DTYPE_FLOAT32),
	}}})
	ob := r.b.result()
	r.pos++
	check("decode step fast path", f32sOf(ob.body(t)), ref.forward(t, []int32{15}))
	if ob.ack.CacheResult.PastLen != uint64(r.pos) || !ob.ack.CacheResult.CacheHit || ob.ack.ExecutionNanos == 0 {
		t.Fatalf("ack %v", ob.ack)
	}
}

// TestChunkedPrefillAndOutputPositions: a prefill in two chunks continues the
// cache; output_positions selects which rows return logits.
func TestChunkedPrefillAndOutputPositions(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{})
	s := w.open(t, "chunks", 1)
	env := s.envelope(1, prefill, 0, 3, 0)
	env.Chunk = &shardv1.ChunkInfo{ChunkIndex: 0, ChunkCount: 2}
	s.chunk(env, s.tokensTensor([]int32{1, 2, 3}))
	if o := s.result(); o.ack == nil || o.ack.CacheResult.PastLen != 3 {
		t.Fatalf("chunk 0: %v %v", o.ack, o.status)
	}
	env = s.envelope(2, prefill, 3, 3, 0)
	env.Chunk = &shardv1.ChunkInfo{ChunkIndex: 1, ChunkCount: 2, FinalChunk: true}
	pos := s.tokensTensor([]int32{3, 5})
	pos.Name = tensorname.OutputPositions
	s.chunk(env, s.tokensTensor([]int32{4, 5, 6}), pos)
	o := s.result()
	if o.ack == nil || o.ack.CacheResult.PastLen != 6 || !o.ack.CacheResult.CacheHit {
		t.Fatalf("chunk 1: %v %v", o.ack, o.status)
	}
	if shape := o.chunk.Bundle.Tensors[0].Shape; shape[0] != 2 || shape[1] != 512 {
		t.Fatalf("logits shape %v", shape)
	}
	// A chunk that does not continue the prefill is a declared miss.
	env = s.envelope(3, prefill, 4, 1, 0)
	s.chunk(env, s.tokensTensor([]int32{7}))
	if o := s.result(); code(o) != cMiss || o.status.Error.ActualPastLen != 6 {
		t.Fatalf("gap: %v", o.status)
	}
	// The prefill is complete: decode continues from 6.
	if o := s.decodeToken(4, 6, 7); o.ack == nil || o.ack.CacheResult.PastLen != 7 {
		t.Fatalf("decode: %v", o.status)
	}
	// STATELESS work runs on its own and leaves the session alone.
	s.chunk(s.envelope(5, shardv1.CacheMode_CACHE_MODE_STATELESS, 0, 2, 0), s.tokensTensor([]int32{1, 2}))
	if o := s.result(); o.ack == nil || o.ack.CacheResult.Mode != shardv1.CacheMode_CACHE_MODE_STATELESS {
		t.Fatalf("stateless: %v", o.status)
	}
	if o := s.decodeToken(6, 7, 8); o.ack == nil || o.ack.CacheResult.PastLen != 8 {
		t.Fatalf("decode after stateless: %v", o.status)
	}
}

// TestInBandReleaseAndCancel: signals on the stream itself.
func TestInBandReleaseAndCancel(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{})
	s := w.open(t, "inband", 1)
	s.prefillTokens(1, 1, 2, 3)
	s.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Cancel{Cancel: &shardv1.CancelSignal{RouteSessionId: "inband", RouteEpoch: 1}}})
	s.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Release{Release: &shardv1.ReleaseSignal{RouteSessionId: "inband", RouteEpoch: 1}}})
	waitFor(t, w.eng, func() bool { return w.eng.sched.Store().Len() == 0 })
	if o := s.decodeToken(2, 3, 4); code(o) != cMiss {
		t.Fatalf("after release: %v", o.status)
	}
}
