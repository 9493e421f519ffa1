package engine

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// result is a completed step's output and acknowledgement. It is shared by
// the results cache and the stream sending it, and reference counted (one
// reference per holder; newResult gives the first): the last release
// returns its body to the buffer pool and the result itself to
// resultPool, so a decode step allocates no result. Its fields are
// immutable once made.
type result struct {
	refs  atomic.Int32
	idBuf []byte // workID's bytes, reused with the result
	resultFields
}

var resultPool = sync.Pool{New: func() any { return new(result) }}

// newResult returns a result holding f, with one reference. It copies the
// work id into its own bytes (f's may be a work item's, which goes back to
// its pool first), so r.workID, too, is valid only while r is referenced:
// whatever keeps it longer copies it.
func newResult(f resultFields) *result {
	r := resultPool.Get().(*result)
	r.resultFields = f
	r.idBuf = append(r.idBuf[:0], f.workID...)
	r.workID = unsafe.String(unsafe.SliceData(r.idBuf), len(r.idBuf))
	r.refs.Store(1)
	return r
}

type resultFields struct {
	workID   string
	session  string
	step     uint64
	epoch    uint64
	phase    shardv1.Phase
	mode     shardv1.CacheMode
	first    int
	tokens   int
	chunk    chunkInfo
	deadline int64

	name   string // hidden_states or logits
	shape  [2]int64
	dtype  shardv1.DType
	body   *bufpool.Buffer
	outPos []int32 // forwarded to the next shard
	// topK > 0: a compact output; body holds the values ([rows, topK]
	// f32, named name) and then their token ids ([rows, topK] int32).
	topK int

	pastLen  uint64
	cacheHit bool
	// prefixRows: the rows of a prefill chunk answered from the prefix
	// cache.
	prefixRows int
	execNanos  uint64

	tm      timings // stage boundaries, when observed
	bytesIn int
}

// Cost is the bytes the results cache counts for r.
func (r *result) Cost() int64 {
	if r.body == nil {
		return 256
	}
	return int64(r.body.Len()) + 256
}

// ref takes a reference for another holder.
func (r *result) ref() *result {
	r.refs.Add(1)
	return r
}

// Retain and Release are ref and release as sched.Output.
func (r *result) Retain()  { r.refs.Add(1) }
func (r *result) Release() { r.release() }

// release drops one holder's reference; the last one frees the result.
// Releasing more often than referenced would hand a result still in use
// to another step, so it stops the process instead.
func (r *result) release() {
	switch n := r.refs.Add(-1); {
	case n > 0:
		return
	case n < 0:
		panic("engine: result released more often than referenced")
	}
	if r.body != nil {
		r.body.Release()
	}
	r.resultFields = resultFields{}
	resultPool.Put(r)
}
