package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

const (
	cUnspec      = shardv1.ErrorCode_ERROR_CODE_UNSPECIFIED
	cSchema      = shardv1.ErrorCode_ERROR_CODE_SCHEMA_UNSUPPORTED
	cFingerprint = shardv1.ErrorCode_ERROR_CODE_FINGERPRINT_MISMATCH
	cStale       = shardv1.ErrorCode_ERROR_CODE_EPOCH_STALE
	cRange       = shardv1.ErrorCode_ERROR_CODE_SHARD_RANGE_MISMATCH
	cMiss        = shardv1.ErrorCode_ERROR_CODE_CACHE_MISS
	cExhausted   = shardv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED
	cCorrupt     = shardv1.ErrorCode_ERROR_CODE_PAYLOAD_CORRUPT
	cCancelled   = shardv1.ErrorCode_ERROR_CODE_CANCELLED
	cDeadline    = shardv1.ErrorCode_ERROR_CODE_DEADLINE_EXCEEDED
	cFlow        = shardv1.ErrorCode_ERROR_CODE_FLOW_CONTROL_VIOLATION
	cInternal    = shardv1.ErrorCode_ERROR_CODE_INTERNAL
)

var (
	prefill = shardv1.CacheMode_CACHE_MODE_PREFILL
	decodeM = shardv1.CacheMode_CACHE_MODE_DECODE
)

// prefillTokens sends a one-chunk prefill of ids from position 0.
func (s *session) prefillTokens(step uint64, ids ...int32) outcome {
	s.t.Helper()
	s.chunk(s.envelope(step, prefill, 0, len(ids), 0), s.tokensTensor(ids))
	return s.result()
}

// decodeToken sends a decode step through the DecodeStep fast path.
func (s *session) decodeToken(step uint64, pos int, id int32) outcome {
	s.t.Helper()
	s.send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Decode{Decode: &shardv1.DecodeStep{
		IdempotencyStep: step, Position: uint64(pos), ExpectedPastLen: uint64(pos), Tensor: s.tokensTensor([]int32{id}), WorkId: "d",
	}}})
	return s.result()
}

// TestOpenRefusals: each refusal at open is a terminal ShardStatus.
func TestOpenRefusals(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{})
	tests := []struct {
		name string
		edit func(o *shardv1.SessionOpen)
		want shardv1.ErrorCode
	}{
		{"schema unspecified", func(o *shardv1.SessionOpen) { o.SchemaVersion = 0 }, cSchema},
		{"model digest", func(o *shardv1.SessionOpen) {
			o.Fingerprint = &shardv1.Fingerprint{ModelArtifactDigest: "sha256:00", RuntimeRecipeDigest: w.id.Fingerprint.RuntimeRecipeDigest, RecipeId: w.id.Fingerprint.RecipeId}
		}, cFingerprint},
		{"recipe digest, same label", func(o *shardv1.SessionOpen) {
			o.Fingerprint = &shardv1.Fingerprint{ModelArtifactDigest: w.id.Fingerprint.ModelArtifactDigest, RuntimeRecipeDigest: "sha256:11", RecipeId: w.id.Fingerprint.RecipeId}
		}, cFingerprint},
		{"no fingerprint", func(o *shardv1.SessionOpen) { o.Fingerprint = nil }, cFingerprint},
		{"range", func(o *shardv1.SessionOpen) { o.ShardRange = &shardv1.ShardRange{StartLayer: 0, EndLayer: 3} }, cRange},
		{"effective start", func(o *shardv1.SessionOpen) {
			o.ShardRange = &shardv1.ShardRange{StartLayer: 0, EndLayer: 6, EffectiveStartLayer: 2}
		}, cRange},
		{"empty session id", func(o *shardv1.SessionOpen) { o.RouteSessionId = "" }, cCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := w.openMsg("open-"+tt.name, 1)
			tt.edit(o)
			_, resp := w.dial(t, o.RouteSessionId, 1, o)
			st := resp.GetStatus()
			if st == nil || !st.Terminal || st.Error.GetCode() != tt.want || st.Error.Detail == "" {
				t.Fatalf("got %v, want terminal %v", resp, tt.want)
			}
		})
	}
	t.Run("first message not open", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stream, _ := w.client.Session(ctx)
		stream.Send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_FlowControl{FlowControl: &shardv1.FlowControl{}}})
		resp, err := stream.Recv()
		if err != nil || !resp.GetStatus().GetTerminal() || resp.GetStatus().GetError().GetCode() != cSchema {
			t.Fatalf("got %v %v", resp, err)
		}
	})
	t.Run("accepted", func(t *testing.T) {
		o := w.openMsg("open-ok", 1)
		o.ProposedFlowControl = &shardv1.FlowControl{MaxInflightChunks: 3, MaxChunkBytes: 1 << 20}
		_, resp := w.dial(t, "open-ok", 1, o)
		a := resp.GetAccepted()
		if a == nil || a.SchemaVersion != shardv1.SchemaVersion_SCHEMA_VERSION_1 || a.Fingerprint.ModelArtifactDigest != w.id.Fingerprint.ModelArtifactDigest {
			t.Fatalf("got %v", resp)
		}
		if fc := a.FlowControl; fc.MaxInflightChunks != 3 || fc.CreditsGranted != 3 || fc.MaxChunkBytes != 1<<20 || fc.MaxPrefillChunkTokens == 0 {
			t.Fatalf("flow control %v", fc)
		}
	})
}

// TestWorkRefusals: each malformed or mistimed unit of work gets its
// ErrorCode, and the stream goes on serving.
func TestWorkRefusals(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{MaxTensorBytes: 4096, MaxPrefillChunkTokens: 16})
	tests := []refusalRow{
		{"schema in envelope", func(s *session) outcome {
			env := s.envelope(1, prefill, 0, 2, 0)
			env.SchemaVersion = 0
			s.chunk(env, s.tokensTensor([]int32{1, 2}))
			return s.result()
		}, cSchema, false},
		{"fingerprint in envelope", func(s *session) outcome {
			env := s.envelope(1, prefill, 0, 2, 0)
			env.Fingerprint = &shardv1.Fingerprint{ModelArtifactDigest: "sha256:00"}
			s.chunk(env, s.tokensTensor([]int32{1, 2}))
			return s.result()
		}, cFingerprint, false},
		{"other session on this stream", func(s *session) outcome {
			env := s.envelope(1, prefill, 0, 2, 0)
			env.RouteSessionId = "someone-else"
			s.chunk(env, s.tokensTensor([]int32{1, 2}))
			return s.result()
		}, cFingerprint, false},
		{"range in envelope", func(s *session) outcome {
			env := s.envelope(1, prefill, 0, 2, 0)
			env.ShardRange = &shardv1.ShardRange{StartLayer: 3, EndLayer: 6, EffectiveStartLayer: 3}
			s.chunk(env, s.tokensTensor([]int32{1, 2}))
			return s.result()
		}, cRange, false},
		{"stale epoch", func(s *session) outcome {
			s.prefillTokens(1, 1, 2)
			env := s.envelope(2, prefill, 0, 2, 0)
			env.RouteEpoch = s.epoch - 1
			s.chunk(env, s.tokensTensor([]int32{1, 2}))
			return s.result()
		}, cStale, false},
		{"epoch below the stream's, before any state", func(s *session) outcome {
			env := s.envelope(1, prefill, 0, 2, 0)
			env.RouteEpoch = s.epoch - 1
			s.chunk(env, s.tokensTensor([]int32{1, 2}))
			o := s.result()
			// Nothing was applied: the session prefills at its own epoch.
			if a := s.prefillTokens(2, 1, 2); a.ack == nil || a.ack.CacheResult.GetPastLen() != 2 {
				s.t.Errorf("prefill at the stream's epoch after the refusal: %v %v", a.ack, a.status)
			}
			return o
		}, cStale, false},
		{"decode with wrong past_len", func(s *session) outcome {
			s.prefillTokens(1, 1, 2, 3)
			s.chunk(s.envelope(2, decodeM, 5, 1, 5), s.tokensTensor([]int32{4}))
			o := s.result()
			if o.status.GetError().GetActualPastLen() != 3 {
				s.t.Errorf("actual_past_len %d, want 3", o.status.GetError().GetActualPastLen())
			}
			return o
		}, cMiss, false},
		{"decode without session state", func(s *session) outcome {
			return s.decodeToken(1, 0, 4)
		}, cMiss, false},
		{"decode before the final prefill chunk", func(s *session) outcome {
			env := s.envelope(1, prefill, 0, 2, 0)
			env.Chunk = &shardv1.ChunkInfo{ChunkIndex: 0, ChunkCount: 2}
			s.chunk(env, s.tokensTensor([]int32{1, 2}))
			if o := s.result(); o.ack == nil {
				s.t.Fatalf("first chunk: %v", o.status)
			}
			return s.decodeToken(2, 2, 3)
		}, cMiss, false},
		{"prefill chunk over max tokens", func(s *session) outcome {
			ids := make([]int32, 17)
			s.chunk(s.envelope(1, prefill, 0, len(ids), 0), s.tokensTensor(ids))
			return s.result()
		}, cFlow, false},
		{"bad CRC", func(s *session) outcome {
			nt := s.tokensTensor([]int32{1, 2})
			nt.Checksum.Value[0] ^= 0xFF
			s.chunk(s.envelope(1, prefill, 0, 2, 0), nt)
			return s.result()
		}, cCorrupt, false},
		{"tensor over budget", func(s *session) outcome {
			ids := make([]int32, 16)
			nt := s.tokensTensor(ids)
			nt.Shape, nt.TotalBytes = []int64{2048}, 8192
			s.chunk(s.envelope(1, prefill, 0, 16, 0), nt)
			return s.result()
		}, cExhausted, false},
		{"unknown tensor", func(s *session) outcome {
			nt := s.tokensTensor([]int32{1})
			nt.Name = "attention_mask"
			s.chunk(s.envelope(1, prefill, 0, 1, 0), s.tokensTensor([]int32{1}), nt)
			return s.result()
		}, cCorrupt, false},
		{"hidden states into the first shard", func(s *session) outcome {
			s.chunk(s.envelope(1, prefill, 0, 1, 0), s.hiddenTensor(make([]byte, 2*128), 1, shardv1.DType_DTYPE_BFLOAT16))
			return s.result()
		}, cCorrupt, false},
		{"token outside vocabulary", func(s *session) outcome {
			return s.prefillTokens(1, 1, 9999)
		}, cCorrupt, false},
		{"token count disagrees with input", func(s *session) outcome {
			s.chunk(s.envelope(1, prefill, 0, 3, 0), s.tokensTensor([]int32{1, 2}))
			return s.result()
		}, cCorrupt, false},
		{"deadline passed", func(s *session) outcome {
			env := s.envelope(1, prefill, 0, 2, 0)
			env.DeadlineUnixNanos = time.Now().Add(-time.Second).UnixNano()
			s.chunk(env, s.tokensTensor([]int32{1, 2}))
			return s.result()
		}, cDeadline, false},
		{"no cache mode", func(s *session) outcome {
			s.chunk(s.envelope(1, shardv1.CacheMode_CACHE_MODE_UNSPECIFIED, 0, 2, 0), s.tokensTensor([]int32{1, 2}))
			return s.result()
		}, cCorrupt, false},
	}
	// The same rows on a direct gRPC hop and on a hop through a relay,
	// where everything the worker checks travels in-band.
	for _, w := range []*worker{w, viaRelay(t, w)} {
		t.Run(w.transport, func(t *testing.T) { workRefusals(t, w, tests) })
	}
}

// refusalRow is a unit of work the worker must refuse with want.
type refusalRow struct {
	name  string
	run   func(s *session) outcome
	want  shardv1.ErrorCode
	retry bool
}

func workRefusals(t *testing.T, w *worker, tests []refusalRow) {
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := w.open(t, fmt.Sprintf("work-%s-%d", w.transport, i), 7)
			s.t = t
			o := tt.run(s)
			if code(o) != tt.want {
				t.Fatalf("got %v (status %v), want %v", code(o), o.status, tt.want)
			}
			if o.status.Error.Retryable != tt.retry || o.status.Terminal || o.status.Error.Detail == "" {
				t.Fatalf("status %v", o.status)
			}
			// The stream still serves: a fresh prefill under a new step works.
			if ok := s.prefillTokens(100, 5, 6); ok.ack == nil {
				t.Fatalf("stream broken after refusal: %v", ok.status)
			}
		})
	}
}

// TestChunkBytesLimit: a message over the negotiated max_chunk_bytes.
func TestChunkBytesLimit(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{})
	o := w.openMsg("bytes", 1)
	o.ProposedFlowControl = &shardv1.FlowControl{MaxChunkBytes: 1024}
	s, resp := w.dial(t, "bytes", 1, o)
	if resp.GetAccepted().GetFlowControl().GetMaxChunkBytes() != 1024 {
		t.Fatalf("negotiation: %v", resp)
	}
	ids := make([]int32, 300)
	s.chunk(s.envelope(1, prefill, 0, len(ids), 0), s.tokensTensor(ids))
	if got := s.result(); code(got) != cFlow {
		t.Fatalf("got %v", got.status)
	}
}

// TestDrainingRefusesSessions: RESOURCE_EXHAUSTED (retryable) at open.
func TestDrainingRefusesSessions(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{})
	if err := w.eng.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, resp := w.dial(t, "late", 1, nil)
	st := resp.GetStatus()
	if st.GetError().GetCode() != cExhausted || !st.GetError().GetRetryable() || !st.Terminal {
		t.Fatalf("got %v", resp)
	}
	h, _ := w.client.Health(context.Background(), &shardv1.HealthRequest{SchemaVersion: 1})
	if h.State != shardv1.ServingState_SERVING_STATE_DRAINING {
		t.Fatalf("health %v", h)
	}
}

// Drain waits for the streams already open: a generation between two
// steps has nothing queued but is not finished.
func TestDrainWaitsForOpenStreams(t *testing.T) {
	w := startWorker(t, newFake(true, true), fakeMeta(), Config{})
	s := w.open(t, "between-steps", 1)
	if o := s.prefillTokens(1, 1, 2); o.ack == nil {
		t.Fatal(o.status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := w.eng.Drain(ctx); err == nil {
		t.Fatal("Drain returned with a stream open")
	}
	// Still served while draining: the open stream's next step.
	if o := s.decodeToken(2, 2, 3); o.ack == nil {
		t.Fatalf("decode while draining: %v", o.status)
	}
	s.close()
	if err := w.eng.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// With DrainHandoff a draining worker refuses the open stream's next
// step too (retryable RESOURCE_EXHAUSTED), so its head moves the session
// to a standby; once the stream closes, the drain ends.
func TestDrainHandoff(t *testing.T) {
	w := startWorker(t, newFake(true, true), fakeMeta(), Config{DrainHandoff: true})
	s := w.open(t, "handed-off", 1)
	if o := s.prefillTokens(1, 1, 2); o.ack == nil {
		t.Fatal(o.status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := w.eng.Drain(ctx); err == nil {
		t.Fatal("Drain returned with a stream open")
	}
	o := s.decodeToken(2, 2, 3)
	if e := o.status.GetError(); o.ack != nil || e.GetCode() != cExhausted || !e.GetRetryable() {
		t.Fatalf("a step while draining with handoff: ack %v, status %v", o.ack, o.status)
	}
	s.close()
	if err := w.eng.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// gated starts a fake worker whose forwards wait at a gate. Closing the
// gate (fb.Open, also at cleanup) lets every later forward through.
func gated(t *testing.T, cfg Config) (*worker, *fakeBackend) {
	fb := newFake(true, true)
	w := startWorker(t, fb, fakeMeta(), cfg) // the probe ran inside New
	fb.Gate, fb.Entered = make(chan struct{}), make(chan struct{}, 64)
	t.Cleanup(fb.Open)
	return w, fb
}

// TestCancelWhileWedged: the stream is out of credit behind a held forward;
// the unary Cancel on a fresh call still cancels the queued work.
func TestCancelWhileWedged(t *testing.T) {
	t.Run("grpc", func(t *testing.T) {
		w, fb := gated(t, Config{})
		cancelWhileWedged(t, w, fb)
	})
	t.Run("relay", func(t *testing.T) {
		w, fb := gated(t, Config{})
		cancelWhileWedged(t, viaRelay(t, w), fb)
	})
}

func cancelWhileWedged(t *testing.T, w *worker, fb *fakeBackend) {
	o := w.openMsg("wedged", 1)
	o.ProposedFlowControl = &shardv1.FlowControl{MaxInflightChunks: 2}
	s, _ := w.dial(t, "wedged", 1, o)
	env := s.envelope(1, prefill, 0, 2, 0)
	env.WorkId = "running"
	s.chunk(env, s.tokensTensor([]int32{1, 2}))
	<-fb.Entered // the first prefill is inside Forward
	env = s.envelope(2, prefill, 0, 2, 0)
	env.WorkId = "queued"
	s.chunk(env, s.tokensTensor([]int32{3, 4}))
	// Out of credit (the stream delivers in order, so "queued" holds the
	// second credit by now): a third item is refused with FLOW_CONTROL_VIOLATION.
	env = s.envelope(3, prefill, 0, 2, 0)
	env.WorkId = "over"
	s.chunk(env, s.tokensTensor([]int32{5, 6}))
	if got := s.result(); code(got) != cFlow || got.status.WorkId != "over" {
		t.Fatalf("third item: %v", got.status)
	}
	done := make(chan *shardv1.CancelResponse)
	go func() {
		r, err := w.client.Cancel(context.Background(), &shardv1.CancelRequest{SchemaVersion: 1, RouteSessionId: "wedged", RouteEpoch: 1, WorkId: "queued"})
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	// The scheduler is inside the held Forward. Once the cancel is waiting
	// in its control queue, let the forward finish: the scheduler takes
	// control operations before it starts another iteration.
	waitUntil(t, func() bool { return len(w.eng.control) == 1 })
	fb.Gate <- struct{}{}
	r := <-done
	results := map[string]outcome{}
	for range 2 {
		o := s.result()
		id := o.status.GetWorkId()
		if o.ack != nil {
			id = o.ack.WorkId
		}
		results[id] = o
	}
	if results["running"].ack == nil || code(results["queued"]) != cCancelled || r.CancelledWorkItems != 1 {
		t.Fatalf("cancelled %d, results %v", r.CancelledWorkItems, results)
	}
}

// TestQueueFull: work beyond the queue depth is RESOURCE_EXHAUSTED, retryable.
func TestQueueFull(t *testing.T) {
	w, fb := gated(t, Config{MaxQueue: 1})
	a := w.open(t, "qa", 1)
	b := w.open(t, "qb", 1)
	a.chunk(a.envelope(1, prefill, 0, 1, 0), a.tokensTensor([]int32{1}))
	<-fb.Entered
	b.chunk(b.envelope(1, prefill, 0, 1, 0), b.tokensTensor([]int32{1}))
	got := b.result()
	if code(got) != cExhausted || !got.status.Error.Retryable {
		t.Fatalf("got %v", got.status)
	}
	fb.Gate <- struct{}{}
	if o := a.result(); o.ack == nil {
		t.Fatalf("held item: %v", o.status)
	}
}

// TestForwardFailure: a failed forward is INTERNAL with a sanitized detail,
// and the session is rewound so a retry starts clean.
func TestForwardFailure(t *testing.T) {
	fb := newFake(true, true)
	w := startWorker(t, fb, fakeMeta(), Config{})
	s := w.open(t, "fail", 1)
	waitFor(t, w.eng, func() bool { fb.Err = errors.New("ggml: /secret/path exploded"); return true })
	got := s.prefillTokens(1, 1, 2)
	if code(got) != cInternal || !got.status.Error.Retryable {
		t.Fatalf("got %v", got.status)
	}
	if d := got.status.Error.Detail; d != "engine: the forward pass failed: see worker log" {
		t.Fatalf("detail leaks: %q", d)
	}
	waitFor(t, w.eng, func() bool { fb.Err = nil; return true })
	if o := s.prefillTokens(2, 1, 2); o.ack == nil || o.ack.CacheResult.PastLen != 2 {
		t.Fatalf("retry: %v %v", o.ack, o.status)
	}
}

// TestUnaryRelease: idempotent, and a stale epoch carries its ShardError in
// the gRPC status details.
func TestUnaryRelease(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{})
	s := w.open(t, "rel", 4)
	if o := s.prefillTokens(1, 1, 2, 3); o.ack == nil {
		t.Fatal(o.status)
	}
	ctx := context.Background()
	_, err := w.client.Release(ctx, &shardv1.ReleaseRequest{SchemaVersion: 1, RouteSessionId: "rel", RouteEpoch: 3})
	st, _ := status.FromError(err)
	if len(st.Details()) != 1 || st.Details()[0].(*shardv1.ShardError).Code != cStale {
		t.Fatalf("stale release: %v", err)
	}
	for i, want := range []bool{true, false} {
		r, err := w.client.Release(ctx, &shardv1.ReleaseRequest{SchemaVersion: 1, RouteSessionId: "rel", RouteEpoch: 4})
		if err != nil || r.Released != want {
			t.Fatalf("release %d: %v %v", i, r, err)
		}
	}
	// Released state is gone: a decode is a declared miss.
	if got := s.decodeToken(2, 3, 1); code(got) != cMiss || got.status.Error.ActualPastLen != 0 {
		t.Fatalf("after release: %v", got.status)
	}
}

// TestCapabilityAndHealth: validated by the real start-up forward.
func TestCapabilityAndHealth(t *testing.T) {
	whole, _ := tinyFiles(t)
	w := startLlama(t, whole, Config{MaxSessions: 3})
	ctx := context.Background()
	c, err := w.client.GetCapability(ctx, &shardv1.CapabilityRequest{SchemaVersion: 1})
	if err != nil || !c.Validated || c.ValidatedAtUnixNanos == 0 || c.MaxConcurrentSessions != 3 || c.MaxContextTokens != 256 {
		t.Fatalf("capability %v %v", c, err)
	}
	if c.Fingerprint.ModelArtifactDigest != w.id.Fingerprint.ModelArtifactDigest || c.ShardRange.EndLayer != 6 || c.Backend == "" {
		t.Fatalf("identity %v", c)
	}
	// Health read right after a reply reflects the state the reply reports.
	health := func() *shardv1.HealthReport {
		t.Helper()
		h, err := w.client.Health(ctx, &shardv1.HealthRequest{SchemaVersion: 1})
		if err != nil || h.State != shardv1.ServingState_SERVING_STATE_SERVING || h.ResidentBytes == 0 {
			t.Fatalf("health %v %v", h, err)
		}
		return h
	}
	for i, id := range []string{"h0", "h1", "h2"} {
		s := w.open(t, id, 1)
		if o := s.prefillTokens(1, 1, 2, 3, 4); o.ack == nil {
			t.Fatalf("prefill %s: %v", id, o.status)
		}
		if h := health(); h.ActiveSessions != uint32(i+1) || h.KvPressure <= 0 || h.BatchOccupancy == 0 {
			t.Fatalf("after prefill %d: %v", i, h)
		}
	}
	for i, id := range []string{"h0", "h1", "h2"} {
		r, err := w.client.Release(ctx, &shardv1.ReleaseRequest{SchemaVersion: 1, RouteSessionId: id, RouteEpoch: 1})
		if err != nil || !r.Released {
			t.Fatalf("release %s: %v %v", id, r, err)
		}
		if h := health(); h.ActiveSessions != uint32(2-i) {
			t.Fatalf("after release %d: %v", i, h)
		}
	}
}
