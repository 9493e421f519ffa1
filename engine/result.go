package engine

import (
	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// result is a completed step's output and acknowledgement. It is shared by
// the results cache and the stream sending it; body is reference counted
// (one reference per holder), the rest is immutable once made.
type result struct {
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

	pastLen   uint64
	cacheHit  bool
	execNanos uint64

	tm      timings // stage boundaries, when observed
	bytesIn int
}

func (r *result) cost() int64 {
	if r.body == nil {
		return 256
	}
	return int64(r.body.Len()) + 256
}

// ref takes a reference for another holder.
func (r *result) ref() *result {
	if r.body != nil {
		r.body.Ref()
	}
	return r
}

// release drops one holder's reference.
func (r *result) release() {
	if r.body != nil {
		r.body.Release()
	}
}
