// The exchange with one hop: a generation's stream to it, framing a unit
// of work as its request, sending it and reading the output and the Ack
// (with the window of un-acked steps), and the release at the end.

package route

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/feature"
	"github.com/meshnet/shardd/internal/tracectx"
	"github.com/meshnet/shardd/stages/decode"
)

// hopStream is one generation's Session stream to one hop.
type hopStream struct {
	hop *Hop
	// opened is the hop's report the stream was opened with: its
	// fingerprint and range go in every envelope; epoch is the route
	// epoch it was opened at (a hop failed over alone moves to a newer
	// one than the others').
	opened *shardv1.CapabilityReport
	epoch  uint64
	stream grpc.BidiStreamingClient[shardv1.SessionRequest, shardv1.SessionResponse]
	cancel context.CancelFunc
	limits *shardv1.FlowControl
	// held are the responses of the last exchange: the chunk, Ack or status
	// it returned alias their receive buffers until the next exchange on
	// this stream releases them (a last hop's logits, 4 x vocab bytes per
	// step, are read where gRPC received them). free keeps released ones.
	held, free []*decode.Response
	// ackDue is the step whose output arrived and whose Ack has not been
	// read yet (0: none). The head goes on with the output at once and
	// reads the Ack at the next exchange on this stream: a worker sends a
	// step's Ack after its output, and behind a large output (a last hop's
	// logits) the Ack waits until the transport has written the output.
	ackDue uint64
	// lazyAck: the granted window allows a second un-acked step, so Acks
	// may be read late.
	lazyAck bool
	// hidden is the width of the hidden states this hop returned first (0:
	// none yet); a later output of another width is refused.
	hidden int64
	// watchdog cancels the stream when an exchange (or the drain at the
	// end) outlasts its bound: a hop whose connection wedges without
	// closing fails the step, which is then resent on a fresh stream,
	// instead of holding the generation forever. Armed per exchange.
	watchdog *time.Timer
	// last is the latest step whose output arrived, for Options.Observe:
	// its wall time waits here for its Ack's execution time.
	last struct {
		step   uint64
		decode bool
		wall   time.Duration
	}
}

// recycle releases the last exchange's responses.
func (s *hopStream) recycle() {
	for i, r := range s.held {
		r.Release()
		s.free = append(s.free, r)
		s.held[i] = nil
	}
	s.held = s.held[:0]
}

// response returns an empty Response to receive into.
func (s *hopStream) response() *decode.Response {
	if n := len(s.free); n > 0 {
		r := s.free[n-1]
		s.free = s.free[:n-1]
		return r
	}
	return new(decode.Response)
}

// open (re)opens hop i's stream.
func (g *gen) open(i int) error { return g.openStream(i, false) }

// openStream opens hop i's stream; reread: the hop's report was just read
// again after a fingerprint refusal, which is not done twice in a row.
func (g *gen) openStream(i int, reread bool) error {
	if old := g.streams[i]; old != nil {
		old.watchdog.Stop()
		old.cancel()
	}
	h := g.hops[i]
	ctx, cancel := context.WithCancel(g.ctx)
	if tp := g.r.opts.TracerProvider; tp != nil {
		var span trace.Span
		ctx, span = tp.Tracer("github.com/meshnet/shardd/route").Start(ctx, "shardd.hop",
			trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attribute.String("shardd.hop", h.Addr)))
		ctx = tracectx.Inject(ctx)
		cancelCtx := cancel
		cancel = func() { cancelCtx(); span.End() }
	}
	wait := g.r.opts.StepTimeout
	if g.r.canFailover() {
		// A worker that does not open a session within seconds is not
		// waited for when another can take its place.
		wait = min(wait, 5*time.Second)
	}
	openCtx, openCancel := context.WithTimeout(ctx, wait)
	defer openCancel()
	stop := context.AfterFunc(openCtx, func() {
		if openCtx.Err() == context.DeadlineExceeded {
			cancel()
		}
	})
	defer stop()
	unreachable := func() bool { return g.ctx.Err() == nil && openCtx.Err() == context.DeadlineExceeded }
	stream, err := h.client.Session(ctx)
	if err != nil {
		cancel()
		if unreachable() {
			return fmt.Errorf("%w: %s did not open a session within %v", ErrUnreachable, h.Addr, wait)
		}
		return fmt.Errorf("route: %s: %w", h.Addr, err)
	}
	// A stream reopened after a transport error stays at its epoch (the
	// step it resends carries it); a new or failed-over one takes the
	// generation's.
	opened, epoch := h.Current(), g.epoch
	if old := g.streams[i]; old != nil {
		epoch = old.epoch
	}
	err = stream.Send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Open{Open: &shardv1.SessionOpen{
		SchemaVersion: shardv1.SchemaVersion_SCHEMA_VERSION_1, RouteSessionId: g.id, RouteEpoch: epoch,
		Fingerprint: opened.GetFingerprint(), ShardRange: opened.GetShardRange(),
	}}})
	var resp *shardv1.SessionResponse
	if err == nil {
		resp, err = stream.Recv()
	}
	if err != nil {
		cancel()
		if unreachable() {
			return fmt.Errorf("%w: %s did not open a session within %v", ErrUnreachable, h.Addr, wait)
		}
		return fmt.Errorf("route: %s: open: %w", h.Addr, err)
	}
	a := resp.GetAccepted()
	if a == nil {
		cancel()
		e := resp.GetStatus().GetError()
		if e.GetCode() == shardv1.ErrorCode_ERROR_CODE_FINGERPRINT_MISMATCH && !reread {
			// The worker on this address is not the one dialled: read its
			// report again, and go on with it if it serves the same shard.
			if err := g.recipeChanged(i); err != nil {
				return err
			}
			return g.openStream(i, true)
		}
		return &RefusedError{Addr: h.Addr, Code: e.GetCode(), Detail: "session refused: " + e.GetDetail(), Retryable: e.GetRetryable()}
	}
	fc := a.FlowControl
	g.streams[i] = &hopStream{hop: h, opened: opened, epoch: epoch, stream: stream, cancel: cancel, limits: fc,
		lazyAck: fc.GetCreditsGranted() >= 2 && fc.GetMaxInflightChunks() >= 2, watchdog: time.AfterFunc(time.Hour, cancel)}
	g.streams[i].watchdog.Stop()
	return nil
}

// closeWait bounds how long the end of a generation waits for a hop's
// stream to finish after the release.
const closeWait = 2 * time.Second

// close releases the session on every hop and ends the streams.
func (g *gen) close() {
	for _, s := range g.streams {
		if s == nil {
			continue
		}
		s.stream.Send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Release{Release: &shardv1.ReleaseSignal{
			RouteSessionId: g.id, RouteEpoch: s.epoch}}})
		s.stream.CloseSend()
		s.watchdog.Reset(min(g.r.opts.StepTimeout, closeWait))
		for {
			if _, err := s.stream.Recv(); err != nil {
				break
			}
		}
		s.watchdog.Stop()
		s.cancel()
		s.recycle()
	}
	if g.ctx.Err() != nil {
		// The streams were cut: cancel and release out of band, on fresh calls.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for _, h := range g.hops {
			h.client.Cancel(ctx, &shardv1.CancelRequest{SchemaVersion: 1, RouteSessionId: g.id, RouteEpoch: g.epoch})
			h.client.Release(ctx, &shardv1.ReleaseRequest{SchemaVersion: 1, RouteSessionId: g.id, RouteEpoch: g.epoch})
		}
	}
}

// send sends unit u to hop i (its input u.in[i]) and returns the output,
// failing the hop over when its worker is gone: the replacement replays
// the session's history (failoverHop) and gets u, or, where that cannot
// be, every hop starts again from position 0 (errCacheMiss).
func (g *gen) send(i int, u *unit) ([]*shardv1.NamedTensor, error) {
	for {
		out, err := g.call(i, g.request(i, u))
		var down *HopDownError
		if !errors.As(err, &down) {
			return out, err
		}
		if err := g.failoverHop(i, err); err != nil {
			return nil, err
		}
	}
}

// request frames unit u for hop i: its input, and beside it the
// session's length on its first prefill chunk and the compact output's K
// to the last hop, each only to a hop that advertises it.
func (g *gen) request(i int, u *unit) *shardv1.SessionRequest {
	deadline := time.Now().Add(g.r.opts.StepTimeout)
	if d, ok := g.ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	hs := g.streams[i]
	if i == len(g.streams)-1 && g.topKTensor != nil && !hs.hop.Features().Has(feature.LogitsTopK) {
		// The last hop came back as a worker without compact output
		// (recipeChanged): whole rows from here on.
		g.topK, g.topKTensor, g.stats.Compact = 0, nil, 0
	}
	tensors := []*shardv1.NamedTensor{u.in[i]}
	opening := u.mode == shardv1.CacheMode_CACHE_MODE_PREFILL && u.first == 0
	if opening && hs.hop.Features().Has(feature.SessionTokens) {
		tensors = append(tensors, g.lenTensor)
	}
	if i == len(g.streams)-1 && g.topKTensor != nil {
		tensors = append(tensors, g.topKTensor)
	}
	if u.mode == shardv1.CacheMode_CACHE_MODE_DECODE && len(tensors) == 1 {
		return &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Decode{Decode: &shardv1.DecodeStep{
			IdempotencyStep: u.step, Position: uint64(u.first), ExpectedPastLen: uint64(u.first),
			Tensor: tensors[0], WorkId: u.workID, DeadlineUnixNanos: deadline.UnixNano(),
		}}}
	}
	phase := shardv1.Phase_PHASE_PREFILL
	expect := &shardv1.CacheExpectation{Mode: u.mode}
	if u.mode == shardv1.CacheMode_CACHE_MODE_DECODE {
		phase, expect.ExpectedPastLen = shardv1.Phase_PHASE_DECODE, uint64(u.first)
	}
	return &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Chunk{Chunk: &shardv1.ActivationChunk{
		Envelope: &shardv1.Envelope{
			SchemaVersion: shardv1.SchemaVersion_SCHEMA_VERSION_1, WorkId: u.workID, RouteSessionId: g.id,
			RouteEpoch: hs.epoch, Fingerprint: hs.opened.GetFingerprint(), ShardRange: hs.opened.GetShardRange(),
			Phase: phase, Position: &shardv1.PositionSpan{FirstPosition: uint64(u.first), TokenCount: uint32(u.n)},
			IdempotencyStep: u.step, CacheExpectation: expect, DeadlineUnixNanos: deadline.UnixNano(), Chunk: u.info,
		},
		Bundle: &shardv1.TensorBundle{BundleVersion: 1, Tensors: tensors},
	}}}
}

// callOnce sends req to hop i and returns the output tensors, resending the
// same step on a fresh stream after a transport error.
func (g *gen) callOnce(i int, req *shardv1.SessionRequest) ([]*shardv1.NamedTensor, error) {
	hs := &g.stats.Hops[i]
	var lastErr error
	for attempt := 0; attempt <= g.r.opts.Retries; attempt++ {
		if attempt > 0 {
			g.stats.Retries++
			if err := g.open(i); err != nil {
				lastErr = err
				if g.ctx.Err() != nil {
					return nil, g.ctx.Err()
				}
				if errors.Is(err, ErrRecipeChanged) || errors.Is(err, ErrRoute) {
					return nil, err // another worker than the route's: no retry mends that
				}
				if errors.Is(err, ErrUnreachable) {
					// Waited for it to come back, in vain.
					return nil, &HopDownError{Hop: i, Addr: g.hops[i].Addr, Cause: err}
				}
				continue
			}
		}
		t0 := time.Now()
		chunk, ack, st, err := g.exchange(i, req)
		if err != nil {
			lastErr = err
			if g.ctx.Err() != nil {
				return nil, g.ctx.Err()
			}
			if g.r.canFailover() {
				if derr := g.down(i, err); derr != nil {
					return nil, derr // gone: another worker takes its place
				}
			}
			continue
		}
		wall := time.Since(t0)
		hs.Calls++
		hs.Wall += wall
		last := &g.streams[i].last
		last.step, last.wall = requestStep(req), wall
		last.decode = req.GetDecode() != nil || req.GetChunk().GetEnvelope().GetPhase() == shardv1.Phase_PHASE_DECODE
		if ack == nil && st == nil {
			// The output came first; its Ack is read at the next exchange.
			return chunk.GetBundle().GetTensors(), nil
		}
		if st != nil {
			if st.GetError().GetCode() == shardv1.ErrorCode_ERROR_CODE_CACHE_MISS {
				return nil, errCacheMiss
			}
			g.stats.RefusedDetails = append(g.stats.RefusedDetails, st.GetError().GetDetail())
			return nil, &RefusedError{Addr: g.streams[i].hop.Addr, Code: st.GetError().GetCode(), Detail: st.GetError().GetDetail(),
				Retryable: st.GetError().GetRetryable()}
		}
		g.countAck(i, ack)
		if chunk == nil {
			// A duplicate whose result the worker no longer holds: the
			// state is right but the output is gone; rebuild it.
			return nil, errCacheMiss
		}
		return chunk.GetBundle().GetTensors(), nil
	}
	return nil, &HopDownError{Hop: i, Addr: g.hops[i].Addr, Cause: fmt.Errorf("step failed after %d attempts: %w", g.r.opts.Retries+1, lastErr)}
}

// requestStep is the idempotency step req carries.
func requestStep(req *shardv1.SessionRequest) uint64 {
	if d := req.GetDecode(); d != nil {
		return d.GetIdempotencyStep()
	}
	return req.GetChunk().GetEnvelope().GetIdempotencyStep()
}

// countAck adds an Ack's figures to hop i's statistics.
func (g *gen) countAck(i int, ack *shardv1.Ack) {
	g.stats.Hops[i].Exec += time.Duration(ack.ExecutionNanos)
	if ack.Duplicate {
		g.stats.DuplicateAcks++
		return
	}
	if obs := g.r.opts.Observe; obs != nil {
		if last := g.streams[i].last; last.step == ack.IdempotencyStep {
			obs(StepSample{Hop: i, Decode: last.decode, Wall: last.wall, Exec: time.Duration(ack.ExecutionNanos)})
		}
	}
}

// exchange sends one unit of work to hop i and reads until its output
// chunk (when the stream allows the Ack to be read late: then ack and st are
// nil), its Ack or its ShardStatus. An Ack still due from the previous
// exchange is read on the way. What it returns is valid until the next
// exchange on the stream.
func (g *gen) exchange(i int, req *shardv1.SessionRequest) (*shardv1.ActivationChunk, *shardv1.Ack, *shardv1.ShardStatus, error) {
	s := g.streams[i]
	s.recycle()
	s.watchdog.Reset(g.r.opts.StepTimeout)
	defer s.watchdog.Stop()
	g.yield()
	err := s.stream.Send(req)
	g.resume()
	if err != nil {
		return nil, nil, nil, err
	}
	var chunk *shardv1.ActivationChunk
	for {
		resp := s.response()
		// Still held on error: RecvMsg may have failed after decoding.
		s.held = append(s.held, resp)
		g.yield()
		err := s.stream.RecvMsg(resp)
		g.resume()
		if err != nil {
			if err == io.EOF {
				return nil, nil, nil, io.ErrUnexpectedEOF
			}
			return nil, nil, nil, err
		}
		switch k := resp.Msg.Kind.(type) {
		case *shardv1.SessionResponse_Chunk:
			chunk = k.Chunk
			if s.lazyAck && s.ackDue == 0 {
				s.ackDue = k.Chunk.GetEnvelope().GetIdempotencyStep()
				return chunk, nil, nil, nil
			}
		case *shardv1.SessionResponse_Ack:
			if s.ackDue != 0 && k.Ack.IdempotencyStep == s.ackDue {
				s.ackDue = 0
				g.countAck(i, k.Ack)
				continue
			}
			return chunk, k.Ack, nil, nil
		case *shardv1.SessionResponse_Status:
			return nil, nil, k.Status, nil
		}
	}
}

// settle reads the Acks still due on every stream, so that a finished
// generation's statistics count every step.
func (g *gen) settle() {
	for i, s := range g.streams {
		if s == nil {
			continue
		}
		s.watchdog.Reset(g.r.opts.StepTimeout)
		for s.ackDue != 0 {
			var resp decode.Response
			if err := s.stream.RecvMsg(&resp); err != nil {
				break
			}
			if ack := resp.Msg.GetAck(); ack != nil && ack.IdempotencyStep == s.ackDue {
				s.ackDue = 0
				g.countAck(i, ack)
			}
			resp.Release()
		}
		s.watchdog.Stop()
	}
}
