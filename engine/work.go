package engine

import (
	"sync"
	"time"
	"unsafe"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/kvcache"
	"github.com/meshnet/shardd/stages"
	"github.com/meshnet/shardd/stages/decode"
)

// maxTopK bounds the compact output's K (see parseTopK).
const maxTopK = 1024

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
	// prefixRows: rows answered from the prefix cache (prefix.go).
	prefixRows int
	queued     time.Time // by the scheduler's clock
	started    time.Time
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

func init() { checkLittleEndian() }

func checkLittleEndian() {
	var x uint16 = 1
	if *(*byte)(unsafe.Pointer(&x)) != 1 {
		panic("engine: shardd needs a little-endian machine")
	}
}
