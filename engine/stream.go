package engine

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/engine/sched"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/sharderr"
	"github.com/meshnet/shardd/internal/tensorname"
	"github.com/meshnet/shardd/internal/wireerr"
	"github.com/meshnet/shardd/stages/decode"
	"github.com/meshnet/shardd/stages/frameout"
)

// reply is one message for a stream's send goroutine.
type reply struct {
	res       *result // a step's output and Ack (holds a reference)
	duplicate bool
	ack       *shardv1.Ack // a bare Ack (duplicate whose result left the cache)
	status    *shardv1.ShardStatus
	accepted  *shardv1.SessionAccepted
	flush     chan struct{} // closed by the sender when it reaches this reply
	// gate, where set, counts the reply until it is released: sent, or
	// dropped with its stream (driver.awaitSends).
	gate *sendGate
}

// release drops what the reply holds. Every reply handed to deliver is
// released exactly once: by deliver where the stream cannot take it, by
// the send loop after sending it, or by close.
func (r reply) release() {
	if r.res != nil {
		r.res.release()
	}
	if r.gate != nil {
		r.gate.release()
	}
}

// stream is one Session stream.
type stream struct {
	e      *Engine
	ss     grpc.BidiStreamingServer[shardv1.SessionRequest, shardv1.SessionResponse]
	ctx    context.Context
	cancel context.CancelFunc

	// Fixed at open.
	id       string // route session id (cloned)
	fc       limits
	zstdOut  bool // the initiator decodes zstd
	zstdIn   bool // we accepted zstd from the initiator
	epoch    uint64
	replies  chan reply
	sendDone chan struct{}

	// gone is set once closed is: the scheduler drops the stream's queued
	// items quietly (sched.Item.Gone).
	gone atomic.Bool

	mu          sync.Mutex // guards the fields below
	outstanding int        // work received and not yet answered
	closed      bool       // no more replies are sent; deliver releases
	draining    bool       // the initiator closed its side
	drained     chan struct{}
}

// deliver queues r for sending. work is true when r answers a work item
// (releasing its credit). It never blocks: the reply queue holds twice the
// flow-control window, which bounds outstanding work; a peer that still
// overflows it is cut off.
func (st *stream) deliver(r reply, work bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if work {
		st.outstanding--
		if st.draining && st.outstanding == 0 && st.drained != nil {
			close(st.drained)
			st.drained = nil
		}
	}
	if st.closed {
		r.release()
		return
	}
	if r.res == nil && r.ack == nil && r.status == nil && r.accepted == nil && r.flush == nil {
		return
	}
	select {
	case st.replies <- r:
	default:
		r.release()
		st.closed = true
		st.gone.Store(true)
		st.cancel()
	}
}

// admitWork takes a credit for a work item, or refuses it.
func (st *stream) admitWork() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.outstanding >= int(st.fc.inflight) {
		return wireerr.Errorf(ErrCredit, "%d chunks un-acked, window %d", st.outstanding, st.fc.inflight)
	}
	st.outstanding++
	return nil
}

// close stops sending and releases queued replies.
func (st *stream) close() {
	st.mu.Lock()
	st.closed = true
	st.gone.Store(true)
	st.mu.Unlock()
	st.cancel()
	<-st.sendDone
	for {
		select {
		case r := <-st.replies:
			r.release()
		default:
			return
		}
	}
}

// sendLoop is the only goroutine that calls Send on the stream.
func (st *stream) sendLoop() {
	defer close(st.sendDone)
	var out outMsgs
	for {
		select {
		case <-st.ctx.Done():
			return
		case r := <-st.replies:
			err := st.send(&out, r)
			r.release()
			if err != nil {
				st.cancel()
				return
			}
		}
	}
}

// outMsgs are the response messages the send goroutine fills and reuses for
// every reply: gRPC has serialized a message when Send returns.
type outMsgs struct {
	resp      shardv1.SessionResponse
	chunkKind shardv1.SessionResponse_Chunk
	ackKind   shardv1.SessionResponse_Ack
	chunk     shardv1.ActivationChunk
	env       shardv1.Envelope
	pos       shardv1.PositionSpan
	expect    shardv1.CacheExpectation
	info      shardv1.ChunkInfo
	bundle    shardv1.TensorBundle
	main      shardv1.NamedTensor
	positions shardv1.NamedTensor
	posBytes  []byte
	topIDs    shardv1.NamedTensor
	ack       shardv1.Ack
	cache     shardv1.CacheResult
	spliced   decode.Spliced
}

func (st *stream) send(out *outMsgs, r reply) error {
	resp := &out.resp
	switch {
	case r.flush != nil:
		close(r.flush)
		return nil
	case r.accepted != nil:
		resp.Kind = &shardv1.SessionResponse_Accepted{Accepted: r.accepted}
		return st.ss.Send(resp)
	case r.status != nil:
		resp.Kind = &shardv1.SessionResponse_Status{Status: r.status}
		st.recordRefusal(r.status)
		return st.ss.Send(resp)
	case r.ack != nil:
		out.ackKind.Ack = r.ack
		resp.Kind = &out.ackKind
		return st.ss.Send(resp)
	case r.res != nil:
		err := st.sendResult(out, r.res, r.duplicate)
		if err == nil && !r.duplicate {
			st.recordStep(r.res, time.Now())
		}
		return err
	}
	return nil
}

// sendResult frames a step's output as an ActivationChunk, then its Ack.
func (st *stream) sendResult(out *outMsgs, r *result, dup bool) error {
	e := st.e
	env := &out.env
	*env = shardv1.Envelope{
		SchemaVersion:     shardv1.SchemaVersion_SCHEMA_VERSION_1,
		WorkId:            r.workID,
		RouteSessionId:    r.session,
		RouteEpoch:        r.epoch,
		Fingerprint:       e.id.Fingerprint,
		ShardRange:        e.id.Range,
		Phase:             r.phase,
		Position:          &out.pos,
		IdempotencyStep:   r.step,
		CacheExpectation:  &out.expect,
		DeadlineUnixNanos: r.deadline,
	}
	out.pos.FirstPosition, out.pos.TokenCount = uint64(r.first), uint32(r.tokens)
	out.expect.Mode = r.mode
	if r.chunk.count > 0 {
		out.info.ChunkIndex, out.info.ChunkCount, out.info.FinalChunk = r.chunk.index, r.chunk.count, r.chunk.final
		env.Chunk = &out.info
	}
	var body, ids []byte
	if r.body != nil {
		body = r.body.Bytes()
	}
	if r.topK > 0 {
		body, ids = body[:len(body)/2], body[len(body)/2:]
	}
	opts := frameout.Options{AcceptZstd: st.zstdOut, FragmentBytes: fragmentBytes(st.fc.chunkBytes)}
	owned := e.framer.Frame(&out.main, r.name, r.shape[:], r.dtype, body, opts)
	defer releaseIf(owned)
	out.bundle.BundleVersion = 1
	out.bundle.Tensors = append(out.bundle.Tensors[:0], &out.main)
	if r.topK > 0 {
		defer releaseIf(e.framer.Frame(&out.topIDs, tensorname.TopIDs, r.shape[:], shardv1.DType_DTYPE_INT32, ids, opts))
		out.bundle.Tensors = append(out.bundle.Tensors, &out.topIDs)
	}
	if len(r.outPos) > 0 {
		out.posBytes = out.posBytes[:0]
		for _, p := range r.outPos {
			out.posBytes = append(out.posBytes, byte(p), byte(p>>8), byte(p>>16), byte(p>>24))
		}
		e.framer.Frame(&out.positions, tensorname.OutputPositions, []int64{int64(len(r.outPos))}, shardv1.DType_DTYPE_INT32, out.posBytes, frameout.Options{})
		out.bundle.Tensors = append(out.bundle.Tensors, &out.positions)
	}
	out.chunk.Envelope, out.chunk.Bundle = env, &out.bundle
	out.chunkKind.Chunk = &out.chunk
	out.resp.Kind = &out.chunkKind
	// The codec hands gRPC the result buffer's large payloads without
	// copying them (decode.Spliced).
	out.spliced = decode.Spliced{Msg: &out.resp, Body: r.body}
	if err := st.ss.SendMsg(&out.spliced); err != nil {
		return err
	}
	out.cache = shardv1.CacheResult{Mode: r.mode, PastLen: r.pastLen, CacheHit: r.cacheHit}
	out.ack = shardv1.Ack{WorkId: r.workID, IdempotencyStep: r.step, Duplicate: dup, ExecutionNanos: r.execNanos, CacheResult: &out.cache}
	out.ackKind.Ack = &out.ack
	out.resp.Kind = &out.ackKind
	return st.ss.Send(&out.resp)
}

// fragmentBytes leaves room for the envelope within max_chunk_bytes.
func fragmentBytes(maxChunk uint64) int {
	if maxChunk == 0 || maxChunk > 4<<20+4096 {
		return 4 << 20
	}
	return int(max(maxChunk/2, 1024))
}

func releaseIf(b *bufpool.Buffer) {
	if b != nil {
		b.Release()
	}
}

// statusFor builds the ShardStatus for a refused unit of work.
// workID is copied: a work item's is reused once the item is answered,
// while the status waits to be sent.
func statusFor(session, workID string, step uint64, err error) *shardv1.ShardStatus {
	return &shardv1.ShardStatus{WorkId: strings.Clone(workID), RouteSessionId: session, IdempotencyStep: step, Error: sharderr.From(err)}
}

// Session serves one Route Session Activation Seam.
func (e *Engine) Session(ss grpc.BidiStreamingServer[shardv1.SessionRequest, shardv1.SessionResponse]) error {
	e.streams.Add(1)
	defer e.streams.Done()
	e.openStreams.Add(1)
	defer e.openStreams.Add(-1)
	sctx, endSpan := e.sessionContext(ss.Context())
	defer endSpan()
	ctx, cancel := context.WithCancel(sctx)
	st := &stream{e: e, ss: ss, ctx: ctx, cancel: cancel, sendDone: make(chan struct{})}

	in := inboundPool.Get().(*decode.Inbound)
	defer func() { in.Release(); inboundPool.Put(in) }()
	if err := ss.RecvMsg(in); err != nil {
		cancel()
		return err
	}
	open := in.Msg.GetOpen()
	var accepted *shardv1.SessionAccepted
	var err error
	if open == nil {
		err = ErrNotOpen
	} else {
		accepted, err = e.open(st, open)
	}
	if err != nil {
		cancel()
		st := statusFor("", "", 0, err)
		if open != nil {
			st.RouteSessionId = strings.Clone(open.RouteSessionId)
		}
		st.Terminal = true
		return ss.Send(&shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Status{Status: st}})
	}
	st.replies = make(chan reply, 2*int(st.fc.inflight)+16)
	go st.sendLoop()
	defer st.close()
	st.deliver(reply{accepted: accepted}, false)
	in.Release()

	for {
		msg := inboundPool.Get().(*decode.Inbound)
		if err := ss.RecvMsg(msg); err != nil {
			inboundPool.Put(msg)
			if errors.Is(err, io.EOF) {
				return st.finish()
			}
			return err
		}
		e.handle(st, msg)
	}
}

// finish waits, after the initiator closed its side, until every work item
// is answered and sent, so that returning does not cut replies off.
func (st *stream) finish() error {
	st.mu.Lock()
	st.draining = true
	var wait chan struct{}
	if st.outstanding > 0 {
		st.drained = make(chan struct{})
		wait = st.drained
	}
	st.mu.Unlock()
	if wait != nil {
		select {
		case <-wait:
		case <-st.ctx.Done():
			return st.ctx.Err()
		}
	}
	// Let the sender send everything queued before the handler returns.
	flushed := make(chan struct{})
	st.deliver(reply{flush: flushed}, false)
	select {
	case <-flushed:
		return nil
	case <-st.ctx.Done():
		return st.ctx.Err()
	}
}

// open settles version, identity and flow control for a new stream.
func (e *Engine) open(st *stream, o *shardv1.SessionOpen) (*shardv1.SessionAccepted, error) {
	if err := e.checkOpen(o); err != nil {
		return nil, err
	}
	st.id = strings.Clone(o.RouteSessionId)
	st.epoch = o.RouteEpoch
	// Admission is read under the state's lock, not on the scheduler
	// goroutine, so a new session does not wait out a forward in progress.
	e.schedMu.Lock()
	var admitErr error
	select {
	case <-e.stopped:
		admitErr = ErrCancelled
	default:
		admitErr = e.admits(st)
	}
	e.schedMu.Unlock()
	if errors.Is(admitErr, ErrNoSession) && len(e.control) > 0 {
		// An operation queued before this open (a release) may make the
		// room: look again behind it.
		if err := e.do(st.ctx, func() { admitErr = e.admits(st) }); err != nil {
			return nil, err
		}
	}
	if admitErr != nil {
		return nil, admitErr
	}
	st.fc = e.negotiate(o.ProposedFlowControl)
	accepted := &shardv1.SessionAccepted{
		SchemaVersion:       shardv1.SchemaVersion_SCHEMA_VERSION_1,
		RouteSessionId:      st.id,
		RouteEpoch:          st.epoch,
		Fingerprint:         e.id.Fingerprint,
		AcceptedCompression: []shardv1.Compression{shardv1.Compression_COMPRESSION_NONE, shardv1.Compression_COMPRESSION_ZSTD},
	}
	accepted.FlowControl = st.fc.proto()
	st.zstdIn = true
	for _, c := range o.AcceptedCompression {
		if c == shardv1.Compression_COMPRESSION_ZSTD {
			st.zstdOut = true
		}
	}
	return accepted, nil
}

// admits is nil when st's session may open: its epoch is current and
// the store has or can make room for it. The caller holds the state.
func (e *Engine) admits(st *stream) error {
	if err := e.sched.Store().CheckEpoch(st.id, st.epoch); err != nil {
		return err
	}
	if !e.sched.Store().CanAdmit(st.id) {
		return ErrNoSession
	}
	return nil
}

// negotiate takes the smaller of each limit (0 in a proposal: no preference).
func (e *Engine) negotiate(p *shardv1.FlowControl) limits {
	l := limits{
		inflight:      e.cfg.MaxInflightChunks,
		chunkBytes:    e.cfg.MaxChunkBytes,
		prefillTokens: min(e.cfg.MaxPrefillChunkTokens, uint32(e.info.CtxTokens)),
	}
	if p == nil {
		return l
	}
	if p.MaxInflightChunks != 0 {
		l.inflight = min(l.inflight, p.MaxInflightChunks)
	}
	if p.MaxPrefillChunkTokens != 0 {
		l.prefillTokens = min(l.prefillTokens, p.MaxPrefillChunkTokens)
	}
	if p.MaxChunkBytes != 0 {
		l.chunkBytes = min(l.chunkBytes, p.MaxChunkBytes)
	}
	return l
}

// handle dispatches one received message; it owns in until it submits work
// (then the work item owns it) or releases it.
func (e *Engine) handle(st *stream, in *decode.Inbound) {
	release := func() { in.Release(); inboundPool.Put(in) }
	switch k := in.Msg.Kind.(type) {
	case *shardv1.SessionRequest_Chunk:
		e.onWork(st, in, k.Chunk.GetEnvelope(), nil, k.Chunk.GetBundle())
	case *shardv1.SessionRequest_Decode:
		e.onWork(st, in, nil, k.Decode, nil)
	case *shardv1.SessionRequest_Release:
		id, epoch := k.Release.RouteSessionId, k.Release.RouteEpoch
		release()
		if id == st.id {
			// Waited for, so that the stream ends only once the session is
			// gone: a client that opens the same id again after the end
			// must not have its new work cancelled by the old release.
			e.do(st.ctx, func() { e.sched.Release(e.drv.clock(), st.id, epoch) })
		}
	case *shardv1.SessionRequest_Cancel:
		id, epoch, workID := k.Cancel.RouteSessionId, k.Cancel.RouteEpoch, strings.Clone(k.Cancel.WorkId)
		release()
		if id == st.id {
			e.do(st.ctx, func() { e.sched.Cancel(e.drv.clock(), st.id, epoch, workID) })
		}
	case *shardv1.SessionRequest_FlowControl:
		// Credit the initiator grants us for responses. Our responses are
		// one-to-one with its requests, which its own window bounds.
		release()
	case *shardv1.SessionRequest_Open:
		release()
		st.deliver(reply{status: statusFor(st.id, "", 0, ErrReopen)}, false)
	default:
		release()
		st.deliver(reply{status: statusFor(st.id, "", 0, wireerr.Errorf(ErrEnvelope, "empty request"))}, false)
	}
}

// onWork validates a chunk (env, bundle) or a decode step (d) and submits it.
func (e *Engine) onWork(st *stream, in *decode.Inbound, env *shardv1.Envelope, d *shardv1.DecodeStep, b *shardv1.TensorBundle) {
	w := newWork(st, in)
	if e.obs.on {
		w.tm.decodeStart, w.tm.decodeEnd = in.DecodeStart, in.DecodeEnd
		e.obs.bytesIn.Add(st.ctx, int64(in.Len()))
	}
	if d != nil {
		w.setWorkID(d.WorkId)
		w.Step = d.IdempotencyStep
	} else if env != nil {
		w.setWorkID(env.WorkId)
		w.Step = env.IdempotencyStep
	}
	refuse := func(err error) {
		st.deliver(reply{status: statusFor(st.id, w.WorkID, w.Step, err)}, false)
		w.recycle()
	}
	if err := st.admitWork(); err != nil {
		refuse(err)
		return
	}
	// From here the item holds a credit: every path answers it as work.
	fail := func(err error) {
		st.deliver(reply{status: statusFor(st.id, w.WorkID, w.Step, err)}, true)
		w.recycle()
	}
	if uint64(in.Len()) > st.fc.chunkBytes {
		fail(wireerr.Errorf(ErrChunkBytes, "%d bytes, limit %d", in.Len(), st.fc.chunkBytes))
		return
	}
	if e.cfg.DrainHandoff && e.State() == shardv1.ServingState_SERVING_STATE_DRAINING {
		fail(ErrHandoff)
		return
	}
	var err error
	if d != nil {
		err = e.parseDecodeStep(w, d)
	} else {
		err = e.parseChunk(st, w, env, b)
	}
	if err != nil {
		fail(err)
		return
	}
	// A valid chunk of a newer epoch (the route changed) moves the stream
	// to it: decode steps, which inherit the stream's epoch, follow, and
	// older work on the stream is stale from now on.
	st.epoch = max(st.epoch, w.Epoch)
	if w.Deadline != 0 && time.Now().UnixNano() > w.Deadline {
		fail(ErrDeadline)
		return
	}
	if e.obs.on {
		w.tm.submitted = time.Now()
	}
	if int(e.queued.Add(1)) > e.cfg.MaxQueue {
		e.queued.Add(-1)
		fail(wireerr.Errorf(ErrQueueFull, "%d items queued", e.cfg.MaxQueue))
		return
	}
	w.OutBytes = e.outBytes(w)
	if e.info.TokensIn {
		w.Input = int32Bytes(w.tokenIDs[:w.Tokens])
	} else {
		w.Input = w.hiddenB
	}
	decoding := w.Mode == sched.Decode
	e.submitQ <- w // capacity MaxQueue: never blocks; w is the scheduler's now
	if decoding {
		if pb, ok := e.be.(backend.Preemptible); ok {
			pb.Preempt()
		}
	}
}
