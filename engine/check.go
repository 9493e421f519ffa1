package engine

import (
	"encoding/binary"
	"unsafe"

	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/engine/sched"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/tensorname"
	"github.com/meshnet/shardd/internal/wireerr"
	"github.com/meshnet/shardd/kvcache"
	"github.com/meshnet/shardd/stages"
	"github.com/meshnet/shardd/stages/receive"
)

// Message checking: what the engine checks of everything an initiator
// sends, before any of it reaches the scheduler. A message that fails gets
// the contract's ErrorCode (errors.go) with a sanitized detail, and only
// its own unit of work is answered.

// checkOpen checks a SessionOpen: schema, serving state, fingerprint,
// range and session id.
func (e *Engine) checkOpen(o *shardv1.SessionOpen) error {
	if o.SchemaVersion < shardv1.SchemaVersion_SCHEMA_VERSION_1 {
		return wireerr.Errorf(ErrSchema, "initiator offers %s, this worker needs SCHEMA_VERSION_1", o.SchemaVersion)
	}
	if e.State() == shardv1.ServingState_SERVING_STATE_DRAINING {
		return ErrDraining
	}
	if !e.validated {
		return wireerr.Errorf(ErrNoSession, "worker is not serving: %s", e.detail)
	}
	if err := e.id.checkFingerprint(o.Fingerprint); err != nil {
		return err
	}
	if err := e.id.checkRange(o.ShardRange); err != nil {
		return err
	}
	if o.RouteSessionId == "" {
		return wireerr.Errorf(ErrEnvelope, "empty route_session_id")
	}
	return nil
}

// parseDecodeStep reads a DecodeStep into w.
func (e *Engine) parseDecodeStep(w *work, d *shardv1.DecodeStep) error {
	w.Mode, w.phase = sched.Decode, shardv1.Phase_PHASE_DECODE
	w.Expected, w.First, w.Tokens, w.Final = d.ExpectedPastLen, int(d.Position), 1, true
	w.Deadline = d.DeadlineUnixNanos
	if d.Tensor == nil {
		return wireerr.Errorf(ErrMissingTensor, "%s", e.inputName())
	}
	return e.parseInput(w, d.Tensor, w.st.zstdIn)
}

// parseChunk reads an ActivationChunk's envelope and bundle into w.
func (e *Engine) parseChunk(st *stream, w *work, env *shardv1.Envelope, b *shardv1.TensorBundle) error {
	if env == nil {
		return wireerr.Errorf(ErrEnvelope, "chunk without envelope")
	}
	if env.SchemaVersion != shardv1.SchemaVersion_SCHEMA_VERSION_1 {
		return wireerr.Errorf(ErrSchema, "%s", env.SchemaVersion)
	}
	if env.RouteSessionId != st.id {
		return ErrIdentity
	}
	// Work older than the stream's epoch is stale, even where the session
	// holds no state yet. (A newer epoch moves the stream on: see onWork.)
	if env.RouteEpoch < st.epoch {
		return wireerr.Errorf(kvcache.ErrEpochStale, "epoch %d on a stream at epoch %d", env.RouteEpoch, st.epoch)
	}
	if err := e.id.checkFingerprint(env.Fingerprint); err != nil {
		return err
	}
	if err := e.id.checkRange(env.ShardRange); err != nil {
		return err
	}
	w.Epoch, w.phase, w.Deadline = env.RouteEpoch, env.Phase, env.DeadlineUnixNanos
	mode := env.CacheExpectation.GetMode()
	w.Mode = schedMode(mode)
	w.Expected = env.CacheExpectation.GetExpectedPastLen()
	if env.Position == nil || env.Position.TokenCount == 0 {
		return wireerr.Errorf(ErrEnvelope, "no token positions")
	}
	w.First, w.Tokens = int(env.Position.FirstPosition), int(env.Position.TokenCount)
	switch w.phase {
	case shardv1.Phase_PHASE_PREFILL, shardv1.Phase_PHASE_DECODE:
	default:
		return wireerr.Errorf(ErrEnvelope, "phase %s in an activation chunk", w.phase)
	}
	switch w.Mode {
	case sched.Prefill, sched.Stateless:
		if uint32(w.Tokens) > st.fc.prefillTokens {
			return wireerr.Errorf(ErrChunkTokens, "%d tokens, limit %d", w.Tokens, st.fc.prefillTokens)
		}
	case sched.Decode:
	default:
		return wireerr.Errorf(ErrEnvelope, "cache mode %s", mode)
	}
	if w.Tokens > e.info.CtxTokens {
		return wireerr.Errorf(ErrChunkTokens, "%d tokens exceed the context of %d", w.Tokens, e.info.CtxTokens)
	}
	w.Final = true
	if c := env.Chunk; c != nil {
		if c.ChunkCount > 0 && c.ChunkIndex >= c.ChunkCount {
			return wireerr.Errorf(ErrEnvelope, "chunk %d of %d", c.ChunkIndex, c.ChunkCount)
		}
		w.chunk = chunkInfo{index: c.ChunkIndex, count: c.ChunkCount, final: c.FinalChunk}
		w.Final = c.FinalChunk
		w.PromptEnd = promptEnd(w.First, w.Tokens, c)
	}
	return e.parseBundle(w, b, st.zstdIn)
}

// promptEnd bounds where the prompt of chunk c (first position first, of
// tokens tokens) ends, for the scheduler (sched.Item.PromptEnd): its chunks
// left, this one included, as long as it, the last no longer; 0 for the
// last chunk (its own end is known) or an unknown count.
func promptEnd(first, tokens int, c *shardv1.ChunkInfo) int {
	if c.FinalChunk || c.ChunkCount == 0 {
		return 0
	}
	return first + tokens*int(c.ChunkCount-c.ChunkIndex)
}

// f32s views little-endian float32 bytes as []float32 without copying (the
// project targets little-endian machines; see checkLittleEndian); b must
// be 4-byte aligned: see alignedBody.
func f32s(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// alignedBody returns t's body 4-byte aligned for f32s. A payload
// aliases the received message at whatever offset protobuf put it, so it may
// be misaligned; then it is copied once into a pooled buffer (pooled memory
// is allocated aligned) that t owns.
func alignedBody(t *stages.Tensor, body []byte, pool *bufpool.Pool) []byte {
	if len(body) == 0 || uintptr(unsafe.Pointer(&body[0]))%4 == 0 {
		return body
	}
	buf := pool.Alloc(len(body))
	b := buf.Bytes()
	copy(b, body)
	t.SetBody(b, buf)
	return b
}

// parseBundle validates a chunk's bundle into w. firstShard says which input
// tensor the shard takes; hidden its width.
func (e *Engine) parseBundle(w *work, b *shardv1.TensorBundle, zstdOK bool) error {
	if b == nil {
		return wireerr.Errorf(ErrMissingTensor, "no bundle")
	}
	if b.BundleVersion > 1 {
		return wireerr.Errorf(ErrBundleVersion, "version %d", b.BundleVersion)
	}
	var haveInput bool
	for _, nt := range b.Tensors {
		switch nt.Name {
		case tensorname.InputIDs, tensorname.Hidden:
			if haveInput {
				return wireerr.Errorf(ErrUnknownTensor, "two input tensors")
			}
			haveInput = true
			if err := e.parseInput(w, nt, zstdOK); err != nil {
				return err
			}
		case tensorname.OutputPositions:
			if err := e.parsePositions(w, nt, zstdOK); err != nil {
				return err
			}
		case tensorname.LogitsTopK:
			if err := e.optional(nt.Name); err != nil {
				return err
			}
			if err := e.parseTopK(w, nt, zstdOK); err != nil {
				return err
			}
		case tensorname.SessionTokens:
			if err := e.optional(nt.Name); err != nil {
				return err
			}
			v, err := e.parseScalar(nt, zstdOK, 1, 1<<30)
			if err != nil {
				return err
			}
			w.Length = v
		default:
			return wireerr.Errorf(ErrUnknownTensor, "%.64q", nt.Name)
		}
	}
	if !haveInput {
		return wireerr.Errorf(ErrMissingTensor, "%s", e.inputName())
	}
	return nil
}

// optional refuses the tensor of an optional behaviour this worker
// withholds (Config.Withhold) as a worker of a release without it would:
// as an unknown tensor.
func (e *Engine) optional(name string) error {
	if !e.features.Has(name) {
		return wireerr.Errorf(ErrUnknownTensor, "%.64q", name)
	}
	return nil
}

func (e *Engine) inputName() string {
	if e.info.TokensIn {
		return tensorname.InputIDs
	}
	return tensorname.Hidden
}

// parseInput validates the input tensor of a chunk or decode step.
func (e *Engine) parseInput(w *work, nt *shardv1.NamedTensor, zstdOK bool) error {
	if nt.Name != e.inputName() {
		return wireerr.Errorf(ErrUnknownTensor, "this shard takes %s, got %.64q", e.inputName(), nt.Name)
	}
	var tm *receive.Timings
	if e.obs.on {
		tm = &w.tm.recv
	}
	if err := e.recv.TensorTimed(&w.hidden, nt, zstdOK, tm); err != nil {
		return err
	}
	body := w.hidden.Contiguous(e.pool)
	elems := int64(1)
	for _, d := range w.hidden.Shape {
		elems *= d
	}
	if e.info.TokensIn {
		if w.hidden.DType != shardv1.DType_DTYPE_INT32 || elems != int64(w.Tokens) {
			return wireerr.Errorf(ErrTensorShape, "input_ids must be INT32 with %d elements", w.Tokens)
		}
		// Decoded into the item's own array, which it keeps from one use
		// to the next: no alignment copy of the message into a buffer.
		ids := w.tokenIDs[:0]
		for i := 0; i+4 <= len(body); i += 4 {
			id := int32(binary.LittleEndian.Uint32(body[i:]))
			if id < 0 || int(id) >= e.info.Vocab {
				return wireerr.Errorf(ErrTokenRange, "token %d, vocabulary %d", id, e.info.Vocab)
			}
			ids = append(ids, id)
		}
		w.tokenIDs = ids
		return nil
	}
	shape := w.hidden.Shape
	if len(shape) == 0 || shape[len(shape)-1] != int64(e.info.Hidden) || elems != int64(w.Tokens*e.info.Hidden) {
		return wireerr.Errorf(ErrTensorShape, "hidden_states must be [%d, %d]", w.Tokens, e.info.Hidden)
	}
	switch w.hidden.DType {
	case shardv1.DType_DTYPE_BFLOAT16:
	case shardv1.DType_DTYPE_FLOAT32:
		w.hiddenF = true
		body = alignedBody(&w.hidden, body, e.pool)
	default:
		return wireerr.Errorf(ErrTensorShape, "hidden_states must be BFLOAT16 or FLOAT32, not %s", w.hidden.DType)
	}
	w.hiddenB = body
	return nil
}

// parseTopK reads a head's request for compact output: one INT32, K in
// 1..maxTopK. A last shard then returns, for each output row, the K best
// logits (logits_top_values, FLOAT32 [rows, K]) and their token ids
// (logits_top_ids, INT32 [rows, K]), best first by argmax.Better (a larger
// logit, ties to the lower id), instead of the whole row: 8K bytes instead
// of 4 x vocab. Greedy needs K = 1, top-k sampling K = k. The request rides
// in the unit of work itself, so it needs no session state and crosses a
// relay like any tensor; only a shard that produces logits takes it.
func (e *Engine) parseTopK(w *work, nt *shardv1.NamedTensor, zstdOK bool) error {
	if !e.info.LogitsOut {
		return wireerr.Errorf(ErrUnknownTensor, "%s: this shard returns hidden states", tensorname.LogitsTopK)
	}
	k, err := e.parseScalar(nt, zstdOK, 1, maxTopK)
	if err != nil {
		return err
	}
	w.topK = min(k, e.info.Vocab)
	return nil
}

// parseScalar reads a tensor that holds one INT32 in [lo, hi].
func (e *Engine) parseScalar(nt *shardv1.NamedTensor, zstdOK bool, lo, hi int32) (int, error) {
	var t stages.Tensor
	defer t.Reset()
	if err := e.recv.Tensor(&t, nt, zstdOK); err != nil {
		return 0, err
	}
	body := t.Contiguous(e.pool)
	if t.DType != shardv1.DType_DTYPE_INT32 || len(body) != 4 {
		return 0, wireerr.Errorf(ErrTensorShape, "%.64s must be one INT32", nt.Name)
	}
	v := int32(binary.LittleEndian.Uint32(body))
	if v < lo || v > hi {
		return 0, wireerr.Errorf(ErrTensorShape, "%.64s %d outside %d..%d", nt.Name, v, lo, hi)
	}
	return int(v), nil
}

func (e *Engine) parsePositions(w *work, nt *shardv1.NamedTensor, zstdOK bool) error {
	var t stages.Tensor
	defer t.Reset()
	if err := e.recv.Tensor(&t, nt, zstdOK); err != nil {
		return err
	}
	if t.DType != shardv1.DType_DTYPE_INT32 || t.TotalBytes == 0 || t.TotalBytes > uint64(4*w.Tokens) {
		return wireerr.Errorf(ErrTensorShape, "output_positions must be 1..%d INT32 values", w.Tokens)
	}
	body := t.Contiguous(e.pool)
	w.OutPos = make([]int32, 0, len(body)/4)
	for i := 0; i+4 <= len(body); i += 4 {
		p := int32(binary.LittleEndian.Uint32(body[i:]))
		if int(p) < w.First || int(p) >= w.First+w.Tokens {
			return wireerr.Errorf(ErrTensorShape, "output position %d outside %d..%d", p, w.First, w.First+w.Tokens-1)
		}
		w.OutPos = append(w.OutPos, p)
	}
	return nil
}
