package engine

import (
	"encoding/binary"
	"sync"
	"time"
	"unsafe"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/wireerr"
	"github.com/meshnet/shardd/kvcache"
	"github.com/meshnet/shardd/stages"
	"github.com/meshnet/shardd/stages/decode"
	"github.com/meshnet/shardd/stages/receive"
)

// Boundary tensor names.
const (
	nameInputIDs        = "input_ids"
	nameHidden          = "hidden_states"
	nameLogits          = "logits"
	nameOutputPositions = "output_positions"
	// Compact output (see parseTopK): the head asks a last shard for the
	// best K logits of each output row instead of the whole row.
	nameLogitsTopK = "logits_top_k"
	nameTopValues  = "logits_top_values"
	nameTopIDs     = "logits_top_ids"
	maxTopK        = 1024
	// nameSessionTokens: in a prefill chunk at position 0, the length the
	// session will reach (its prompt plus the head's maximum new tokens);
	// the worker reserves that many KV tokens for it (kvcache.Store.Begin).
	nameSessionTokens = "session_tokens"
)

// work is one unit of work: a prefill chunk or a decode step, from receipt to
// its reply. Fields above the line are set by the receive goroutine; the
// rest belong to the scheduler.
//
// Items come from workPool and go back to it once answered (recycle), so a
// decode step allocates none. Their work id lives in the item's own bytes
// (idBuf), reused with it: w.workID is valid only while the item is, and
// whatever keeps a work id longer copies it (statusFor, newResult, the
// bare duplicate Ack).
type work struct {
	st       *stream
	in       *decode.Inbound // the received message; released once rows are in a batch
	workID   string          // views idBuf
	idBuf    []byte
	free     bool // in workPool
	step     uint64
	epoch    uint64
	phase    shardv1.Phase
	mode     shardv1.CacheMode
	expected uint64 // expected_past_len (DECODE)
	first    int    // first position
	tokens   int
	final    bool // last chunk of a prefill (or a single-chunk prefill)
	chunk    chunkInfo
	deadline int64
	tm       timings // when the engine observes
	bytesIn  int

	tokenIDs []int32       // first shard: input ids, decoded into the item's own array
	hidden   stages.Tensor // other shards: validated hidden states
	hiddenB  []byte        // hidden's contiguous bytes
	hiddenF  bool          // hidden is f32 rather than bf16
	outPos   []int32       // output_positions (absolute), owned copy; nil: last row only
	topK     int           // logits_top_k: the compact output's K (0: whole rows)
	length   int           // session_tokens: the session's stated length (0: not stated)

	// --- scheduler ---
	admitted bool
	sess     *kvcache.Session
	pin      *kvcache.Session // the session this item pins (queued or running)
	seq      int
	done     int // rows run so far
	out      *bufpool.Buffer
	outRows  int
	topIDs   []int32 // compact output: the rows' token ids, appended to out on completion
	hit      bool
	queued   time.Time // by the scheduler's clock
	started  time.Time
}

var workPool = sync.Pool{New: func() any { return new(work) }}

// newWork returns an empty item from the pool for st's message in.
func newWork(st *stream, in *decode.Inbound) *work {
	w := workPool.Get().(*work)
	w.free = false
	w.st, w.in, w.epoch, w.bytesIn = st, in, st.epoch, in.Len()
	return w
}

// setWorkID copies id into the item's own bytes.
func (w *work) setWorkID(id string) {
	w.idBuf = append(w.idBuf[:0], id...)
	w.workID = unsafe.String(unsafe.SliceData(w.idBuf), len(w.idBuf))
}

// recycle returns an answered item to the pool, keeping its arrays (the
// id's bytes, the token ids, the tensor's segment list). Nothing may hold
// w afterwards: until the pool hands it out again its stream is nil, so a
// late use fails at once, and a second recycle panics.
func (w *work) recycle() {
	if w.free {
		// Two holders would share the item the pool hands out next.
		panic("engine: work item recycled twice")
	}
	w.releaseInput()
	if w.out != nil {
		w.out.Release()
	}
	*w = work{idBuf: w.idBuf[:0], hidden: w.hidden, tokenIDs: w.tokenIDs[:0], topIDs: w.topIDs[:0], free: true}
	workPool.Put(w)
}

// chunkInfo is a prefill chunk's place in its prefill (ChunkInfo, by value).
type chunkInfo struct {
	index, count uint32
	final        bool
}

// limits are a stream's negotiated flow-control limits (FlowControl, by
// value).
type limits struct {
	inflight      uint32
	chunkBytes    uint64
	prefillTokens uint32
}

func (l limits) proto() *shardv1.FlowControl {
	return &shardv1.FlowControl{
		CreditsGranted:        l.inflight,
		MaxInflightChunks:     l.inflight,
		MaxChunkBytes:         l.chunkBytes,
		MaxPrefillChunkTokens: l.prefillTokens,
	}
}

// rowWantsOutput reports whether row r (0-based within the chunk) produces
// logits on a last shard.
func (w *work) rowWantsOutput(r int) bool {
	if w.outPos == nil {
		return r == w.tokens-1
	}
	p := int32(w.first + r)
	for _, q := range w.outPos {
		if q == p {
			return true
		}
	}
	return false
}

// outputRows is how many rows produce logits.
func (w *work) outputRows() int {
	if w.outPos == nil {
		return 1
	}
	return len(w.outPos)
}

// releaseInput drops the received message and the tensor view into it.
func (w *work) releaseInput() {
	w.hidden.Reset()
	w.hiddenB, w.tokenIDs = nil, w.tokenIDs[:0]
	if w.in != nil {
		w.in.Release()
		inboundPool.Put(w.in)
		w.in = nil
	}
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

func init() { checkLittleEndian() }

func checkLittleEndian() {
	var x uint16 = 1
	if *(*byte)(unsafe.Pointer(&x)) != 1 {
		panic("engine: shardd needs a little-endian machine")
	}
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
		case nameInputIDs, nameHidden:
			if haveInput {
				return wireerr.Errorf(ErrUnknownTensor, "two input tensors")
			}
			haveInput = true
			if err := e.parseInput(w, nt, zstdOK); err != nil {
				return err
			}
		case nameOutputPositions:
			if err := e.parsePositions(w, nt, zstdOK); err != nil {
				return err
			}
		case nameLogitsTopK:
			if err := e.parseTopK(w, nt, zstdOK); err != nil {
				return err
			}
		case nameSessionTokens:
			v, err := e.parseScalar(nt, zstdOK, 1, 1<<30)
			if err != nil {
				return err
			}
			w.length = v
		default:
			return wireerr.Errorf(ErrUnknownTensor, "%.64q", nt.Name)
		}
	}
	if !haveInput {
		return wireerr.Errorf(ErrMissingTensor, "%s", e.inputName())
	}
	return nil
}

func (e *Engine) inputName() string {
	if e.info.TokensIn {
		return nameInputIDs
	}
	return nameHidden
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
		if w.hidden.DType != shardv1.DType_DTYPE_INT32 || elems != int64(w.tokens) {
			return wireerr.Errorf(ErrTensorShape, "input_ids must be INT32 with %d elements", w.tokens)
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
	if len(shape) == 0 || shape[len(shape)-1] != int64(e.info.Hidden) || elems != int64(w.tokens*e.info.Hidden) {
		return wireerr.Errorf(ErrTensorShape, "hidden_states must be [%d, %d]", w.tokens, e.info.Hidden)
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
		return wireerr.Errorf(ErrUnknownTensor, "%s: this shard returns hidden states", nameLogitsTopK)
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
	if t.DType != shardv1.DType_DTYPE_INT32 || t.TotalBytes == 0 || t.TotalBytes > uint64(4*w.tokens) {
		return wireerr.Errorf(ErrTensorShape, "output_positions must be 1..%d INT32 values", w.tokens)
	}
	body := t.Contiguous(e.pool)
	w.outPos = make([]int32, 0, len(body)/4)
	for i := 0; i+4 <= len(body); i += 4 {
		p := int32(binary.LittleEndian.Uint32(body[i:]))
		if int(p) < w.first || int(p) >= w.first+w.tokens {
			return wireerr.Errorf(ErrTensorShape, "output position %d outside %d..%d", p, w.first, w.first+w.tokens-1)
		}
		w.outPos = append(w.outPos, p)
	}
	return nil
}
