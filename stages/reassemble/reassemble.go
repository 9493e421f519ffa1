// Package reassemble validates a named tensor's header and proves that its
// fragments tile the wire body exactly, turning a received NamedTensor into a
// stages.Tensor whose segments alias the received payloads.
//
// Nothing is copied here: tiling is a property of offsets and lengths. A
// consumer that needs contiguous bytes asks the Tensor (stages.Tensor.
// Contiguous) and pays for a copy into a pooled buffer only then.
package reassemble

import (
	"math"
	"math/bits"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/wireerr"
	"github.com/meshnet/shardd/stages"
	"github.com/meshnet/shardd/stages/dtype"
)

const corrupt = shardv1.ErrorCode_ERROR_CODE_PAYLOAD_CORRUPT

// Refusals, each with the contract code it maps to.
var (
	ErrNoFragments       = wireerr.New(corrupt, "reassemble: tensor has no fragments")
	ErrCountInconsistent = wireerr.New(corrupt, "reassemble: fragments disagree on fragment_count")
	ErrIndexOutOfRange   = wireerr.New(corrupt, "reassemble: fragment_index outside fragment_count")
	ErrDuplicateIndex    = wireerr.New(corrupt, "reassemble: fragment_index repeated")
	ErrHole              = wireerr.New(corrupt, "reassemble: fragments leave a hole")
	ErrOverlap           = wireerr.New(corrupt, "reassemble: fragments overlap")
	ErrPastEnd           = wireerr.New(corrupt, "reassemble: fragment extends past the tensor")
	ErrShortBody         = wireerr.New(corrupt, "reassemble: fragments do not cover the tensor")
	ErrSizeMismatch      = wireerr.New(corrupt, "reassemble: total_bytes disagrees with shape and dtype")
	ErrBadShape          = wireerr.New(corrupt, "reassemble: shape has a negative or oversized dimension")
	ErrDTypeUnspecified  = wireerr.New(corrupt, "reassemble: dtype unspecified or unknown")
	ErrByteOrder         = wireerr.New(corrupt, "reassemble: byte order must be little-endian")
	ErrCompression       = wireerr.New(corrupt, "reassemble: compression unspecified or unknown")
	ErrOverBudget        = wireerr.New(shardv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED, "reassemble: tensor exceeds the byte budget")
)

// Budget bounds what a receiver accepts for one tensor.
type Budget struct {
	// MaxTensorBytes bounds total_bytes (the uncompressed size) and the wire
	// body. A larger tensor is refused before anything is buffered.
	MaxTensorBytes uint64
}

// Into validates nt and fills t (which it Resets first) with its header and
// wire segments in offset order. On error t holds nothing that needs
// releasing. t's fields alias nt, which must stay alive (and its receive
// buffer referenced) while t is in use.
func Into(t *stages.Tensor, nt *shardv1.NamedTensor, b Budget) error {
	t.Reset()
	if err := checkHeader(nt, b); err != nil {
		return err
	}
	frags := nt.Fragments
	count := len(frags)
	if count == 0 {
		return ErrNoFragments
	}
	declared := frags[0].FragmentCount
	segs := t.ResizeSegments(count)
	placed := 0
	for _, f := range frags {
		if f.FragmentCount != declared {
			return wireerr.Errorf(ErrCountInconsistent, "%d and %d", declared, f.FragmentCount)
		}
		if f.FragmentIndex >= declared {
			return wireerr.Errorf(ErrIndexOutOfRange, "index %d of %d", f.FragmentIndex, declared)
		}
		if int(f.FragmentIndex) >= count {
			// Fewer fragments arrived than declared: the missing ones are a hole.
			return wireerr.Errorf(ErrHole, "%d of %d fragments present", count, declared)
		}
		if segs[f.FragmentIndex] != nil {
			return wireerr.Errorf(ErrDuplicateIndex, "index %d", f.FragmentIndex)
		}
		// A non-nil marker even for an empty payload, so duplicates are seen.
		segs[f.FragmentIndex] = f.Payload[:len(f.Payload):len(f.Payload)]
		if segs[f.FragmentIndex] == nil {
			segs[f.FragmentIndex] = emptyPayload
		}
		placed++
	}
	if uint32(placed) != declared {
		return wireerr.Errorf(ErrHole, "%d of %d fragments present", placed, declared)
	}

	// Offsets must tile in index order: each fragment starts where the one
	// before it ended.
	limit := b.MaxTensorBytes
	if nt.Compression == shardv1.Compression_COMPRESSION_NONE {
		limit = nt.TotalBytes
	}
	byIndex := indexOrder(frags)
	var next uint64
	for i, f := range byIndex {
		switch {
		case f.ByteOffset > next:
			return wireerr.Errorf(ErrHole, "fragment %d starts at %d, expected %d", i, f.ByteOffset, next)
		case f.ByteOffset < next:
			return wireerr.Errorf(ErrOverlap, "fragment %d starts at %d, expected %d", i, f.ByteOffset, next)
		}
		end := next + uint64(len(f.Payload))
		if end > limit {
			if nt.Compression == shardv1.Compression_COMPRESSION_NONE {
				return wireerr.Errorf(ErrPastEnd, "fragment %d ends at %d of %d", i, end, limit)
			}
			return wireerr.Errorf(ErrOverBudget, "wire body over %d bytes", limit)
		}
		next = end
	}
	if nt.Compression == shardv1.Compression_COMPRESSION_NONE && next != nt.TotalBytes {
		return wireerr.Errorf(ErrShortBody, "%d of %d bytes", next, nt.TotalBytes)
	}
	for i := range segs {
		if len(segs[i]) == 0 {
			segs[i] = nil
		}
	}

	t.Name = nt.Name
	t.Shape = nt.Shape
	t.DType = nt.Dtype
	t.Compression = nt.Compression
	t.TotalBytes = nt.TotalBytes
	t.Checksum = nt.Checksum
	return nil
}

var emptyPayload = make([]byte, 0)

// indexOrder returns the fragments ordered by index. The common cases, one
// fragment or fragments already in index order, return frags itself.
func indexOrder(frags []*shardv1.TensorFragment) []*shardv1.TensorFragment {
	inOrder := true
	for i, f := range frags {
		if int(f.FragmentIndex) != i {
			inOrder = false
			break
		}
	}
	if inOrder {
		return frags
	}
	// Indices are a permutation of 0..n-1 (checked by the caller).
	ordered := make([]*shardv1.TensorFragment, len(frags))
	for _, f := range frags {
		ordered[f.FragmentIndex] = f
	}
	return ordered
}

func checkHeader(nt *shardv1.NamedTensor, b Budget) error {
	if nt.TotalBytes > b.MaxTensorBytes {
		return wireerr.Errorf(ErrOverBudget, "%d bytes over a budget of %d", nt.TotalBytes, b.MaxTensorBytes)
	}
	elem := dtype.Size(nt.Dtype)
	if elem == 0 {
		return wireerr.Errorf(ErrDTypeUnspecified, "%s", nt.Dtype)
	}
	if nt.ByteOrder != shardv1.ByteOrder_BYTE_ORDER_LITTLE_ENDIAN {
		return wireerr.Errorf(ErrByteOrder, "got %s", nt.ByteOrder)
	}
	switch nt.Compression {
	case shardv1.Compression_COMPRESSION_NONE, shardv1.Compression_COMPRESSION_ZSTD:
	default:
		return wireerr.Errorf(ErrCompression, "%s", nt.Compression)
	}
	size := uint64(elem)
	for _, d := range nt.Shape {
		if d < 0 || d > math.MaxUint32 {
			return wireerr.Errorf(ErrBadShape, "dimension %d", d)
		}
		hi, lo := bits.Mul64(size, uint64(d))
		if hi != 0 || lo > b.MaxTensorBytes {
			return wireerr.Errorf(ErrOverBudget, "shape exceeds a budget of %d bytes", b.MaxTensorBytes)
		}
		size = lo
	}
	if size != nt.TotalBytes {
		return wireerr.Errorf(ErrSizeMismatch, "shape needs %d bytes, total_bytes is %d", size, nt.TotalBytes)
	}
	return nil
}
