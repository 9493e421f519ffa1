package engine

import (
	"sync"
	"unsafe"

	"github.com/meshnet/shardd/engine/sched"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/stages"
	"github.com/meshnet/shardd/stages/decode"
)

// maxTopK bounds the compact output's K (see parseTopK).
const maxTopK = 1024

// work is one unit of work: a prefill chunk or a decode step, from receipt
// to its reply. Its sched.Item is what the scheduler sees (its fields
// above the line set by the receive goroutine, the rest the scheduler's);
// the fields here are the wire's, which the scheduler never reads.
//
// Items come from workPool and go back to it once answered (recycle), so a
// decode step allocates none. Their work id lives in the item's own bytes
// (idBuf), reused with it: w.WorkID is valid only while the item is, and
// whatever keeps a work id longer copies it (statusFor, newResult, the
// bare duplicate Ack).
type work struct {
	sched.Item
	st      *stream
	in      *decode.Inbound // the received message; released once answered
	idBuf   []byte
	free    bool // in workPool
	phase   shardv1.Phase
	chunk   chunkInfo
	tm      timings // when the engine observes
	bytesIn int

	tokenIDs []int32       // first shard: input ids, decoded into the item's own array
	hidden   stages.Tensor // other shards: validated hidden states
	hiddenB  []byte        // hidden's contiguous bytes
	hiddenF  bool          // hidden is f32 rather than bf16
	topK     int           // logits_top_k: the compact output's K (0: whole rows)
	topIDs   []int32       // compact output: the rows' token ids, appended to the output on completion
}

var workPool = sync.Pool{New: func() any { return new(work) }}

// newWork returns an empty item from the pool for st's message in.
func newWork(st *stream, in *decode.Inbound) *work {
	w := workPool.Get().(*work)
	w.free = false
	w.st, w.in, w.bytesIn = st, in, in.Len()
	w.Owner, w.Gone, w.Session, w.Epoch = w, &st.gone, st.id, st.epoch
	return w
}

// setWorkID copies id into the item's own bytes.
func (w *work) setWorkID(id string) {
	w.idBuf = append(w.idBuf[:0], id...)
	w.WorkID = unsafe.String(unsafe.SliceData(w.idBuf), len(w.idBuf))
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
	if w.Out != nil {
		w.Out.Release()
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

// releaseInput drops the received message and the tensor view into it.
func (w *work) releaseInput() {
	w.hidden.Reset()
	w.hiddenB, w.tokenIDs, w.Input = nil, w.tokenIDs[:0], nil
	if w.in != nil {
		w.in.Release()
		inboundPool.Put(w.in)
		w.in = nil
	}
}

// int32Bytes views token ids as their little-endian bytes.
func int32Bytes(ids []int32) []byte {
	if len(ids) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&ids[0])), 4*len(ids))
}

func init() { checkLittleEndian() }

func checkLittleEndian() {
	var x uint16 = 1
	if *(*byte)(unsafe.Pointer(&x)) != 1 {
		panic("engine: shardd needs a little-endian machine")
	}
}
