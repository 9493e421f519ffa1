package llamacpp

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"unsafe"

	"github.com/meshnet/shardd/backend"
)

var _ backend.SeqStater = (*Backend)(nil)

// SeqSave appends the KV state of seq to dst (llama_state_seq_get_data:
// every cell of the sequence, with its positions, in every layer of this
// shard).
func (b *Backend) SeqSave(dst []byte, seq int) ([]byte, error) {
	if seq < 0 || seq >= b.info.MaxSeqs {
		return dst, fmt.Errorf("%w: sequence %d", backend.ErrInput, seq)
	}
	n := int(C.llama_state_seq_get_size(b.ctx, b.kvSeq(seq)))
	if n == 0 {
		return dst, fmt.Errorf("%w: saving sequence %d", backend.ErrForward, seq)
	}
	dst = slices.Grow(dst, n)
	buf := dst[len(dst) : len(dst)+n]
	got := int(C.llama_state_seq_get_data(b.ctx, (*C.uint8_t)(unsafe.Pointer(&buf[0])), C.size_t(n), b.kvSeq(seq)))
	if got == 0 || got > n {
		return dst, fmt.Errorf("%w: saving sequence %d", backend.ErrForward, seq)
	}
	return dst[:len(dst)+got], nil
}

// SeqLoad puts a state from SeqSave (of a backend of the same file and
// context settings) into seq, which must hold no cells.
func (b *Backend) SeqLoad(seq int, state []byte) error {
	if seq < 0 || seq >= b.info.MaxSeqs || len(state) == 0 {
		return fmt.Errorf("%w: sequence %d, %d bytes of state", backend.ErrInput, seq, len(state))
	}
	got := int(C.llama_state_seq_set_data(b.ctx, (*C.uint8_t)(unsafe.Pointer(&state[0])), C.size_t(len(state)), b.kvSeq(seq)))
	if got == 0 {
		return fmt.Errorf("%w: no room for %d bytes of state in sequence %d", backend.ErrKVFull, len(state), seq)
	}
	return nil
}

var _ backend.SeqCounter = (*Backend)(nil)

// SeqNext is the position seq's next row must have (its last cell's + 1).
func (b *Backend) SeqNext(seq int) int {
	if seq < 0 || seq >= b.info.MaxSeqs {
		return 0
	}
	return int(C.llama_memory_seq_pos_max(C.llama_get_memory(b.ctx), b.kvSeq(seq))) + 1
}

// SeqInOrder reports how many positions from 0 the state holds in
// position order (backend.SeqStater). It reads the cells' positions from
// the state's cell lists, which llama.cpp writes in cache order after the
// context's magic and sequence id (llama_kv_cache::state_write: per KV
// stream a cell count, then each cell's position and sequence ids, then
// the K and V rows of every layer), once for the cache and, on a model
// with sliding-window layers, once more for their cache. The answer is
// the smallest over the lists: a list that lacks position 0 (a
// sliding-window cache that dropped its oldest cells) gives 0, since the
// order its cells were summed in is no longer known.
func (b *Backend) SeqInOrder(state []byte) int {
	n, ok := stateInOrder(state)
	if !ok {
		return 0
	}
	return n
}

// stateMagic opens every sequence state (llama-context.cpp's io_magic),
// before the sequence id it was saved from and the memory's own layout.
const stateMagic = 0xaf143cd8

// header reads the state's magic and sequence id, and returns them as
// they were; ok is false when the magic is not there.
func (r *stateReader) header() ([]byte, bool) {
	h := r.take(8)
	return h, !r.bad && binary.LittleEndian.Uint32(h) == stateMagic
}

// stateInOrder parses a sequence state (see SeqInOrder); ok is false for
// bytes that are not one.
func stateInOrder(state []byte) (int, bool) {
	r := stateReader{b: state}
	if _, ok := r.header(); !ok {
		return 0, false
	}
	best, lists := math.MaxInt, 0
	for len(r.b) > 0 {
		streams := r.u32()
		for range streams {
			cells := int(r.u32())
			if r.bad || cells == 0 {
				continue
			}
			if cells > len(r.b)/12 { // each cell: position, count, one id at least
				return 0, false
			}
			pos := make([]int32, cells)
			for i := range pos {
				pos[i] = int32(r.u32())
				r.skip(4 * int(r.u32())) // sequence ids
			}
			r.cutLayers(nil, make([]bool, cells), false) // skips the K and V rows
			if r.bad {
				return 0, false
			}
			best, lists = min(best, inOrder(pos)), lists+1
		}
		if r.bad {
			return 0, false
		}
	}
	if lists == 0 {
		return 0, true
	}
	return best, true
}

// inOrder is the largest n such that positions 0..n-1 are all in pos (cache
// order) and appear there in increasing order.
func inOrder(pos []int32) int {
	// Position q is out of order when a smaller position comes after it;
	// n stops at the first such q, and at the first position missing.
	n := int32(len(pos))
	low := int32(math.MaxInt32) // the smallest position after index i
	for i := len(pos) - 1; i >= 0; i-- {
		if low < pos[i] {
			n = min(n, pos[i])
		}
		low = min(low, pos[i])
	}
	seen := make([]bool, n)
	for _, p := range pos {
		if p >= 0 && p < n {
			seen[p] = true
		}
	}
	for i, s := range seen {
		if !s {
			return i
		}
	}
	return int(n)
}

// stateReader reads llama.cpp's state layout; bad is set at the first read
// past the end.
type stateReader struct {
	b   []byte
	bad bool
}

func (r *stateReader) u32() uint32 {
	if len(r.b) < 4 {
		r.bad, r.b = true, nil
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *stateReader) u64() uint64 {
	lo := uint64(r.u32())
	return lo | uint64(r.u32())<<32
}

func (r *stateReader) skip(n int) {
	if n < 0 || n > len(r.b) {
		r.bad, r.b = true, nil
		return
	}
	r.b = r.b[n:]
}

// SeqCut appends to dst a state that holds only the cells of positions
// [0, n) of state, a state from SeqSave (backend.SeqStater): an entry of a
// prompt's first blocks carries neither the cells after them nor, when
// loaded, leaves holes where those cells would be trimmed.
func (b *Backend) SeqCut(dst, state []byte, n int) ([]byte, error) {
	out, ok := cutState(dst, state, int32(n))
	if !ok {
		return dst, fmt.Errorf("%w: not a sequence state", backend.ErrInput)
	}
	return out, nil
}

// cutState writes state with only the cells whose position is below n,
// keeping the layout stateInOrder reads.
func cutState(dst, state []byte, n int32) ([]byte, bool) {
	r := stateReader{b: state}
	h, ok := r.header()
	if !ok {
		return dst, false
	}
	dst = append(dst, h...)
	for len(r.b) > 0 {
		streams := r.u32()
		dst = binary.LittleEndian.AppendUint32(dst, streams)
		for range streams {
			cells := int(r.u32())
			if r.bad || cells > len(r.b)/12 {
				return dst, false
			}
			keep := make([]bool, cells)
			var meta [][]byte
			for i := range keep {
				entry := r.b
				pos := int32(r.u32())
				ids := int(r.u32())
				r.skip(4 * ids)
				if r.bad {
					return dst, false
				}
				if keep[i] = pos < n; keep[i] {
					meta = append(meta, entry[:8+4*ids])
				}
			}
			dst = binary.LittleEndian.AppendUint32(dst, uint32(len(meta)))
			if cells == 0 {
				continue
			}
			for _, m := range meta {
				dst = append(dst, m...)
			}
			var ok bool
			if dst, ok = r.cutLayers(dst, keep, len(meta) > 0); !ok {
				return dst, false
			}
		}
		if r.bad {
			return dst, false
		}
	}
	return dst, true
}

// take returns the next n bytes.
func (r *stateReader) take(n int) []byte {
	if n < 0 || n > len(r.b) {
		r.bad, r.b = true, nil
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// cutLayers copies the K and V rows of the kept cells
// (llama_kv_cache::state_write_data), or with write false passes over
// them (a stream with no cell kept has no layer data at all).
func (r *stateReader) cutLayers(dst []byte, keep []bool, write bool) ([]byte, bool) {
	u32 := func(v uint32) {
		if write {
			dst = binary.LittleEndian.AppendUint32(dst, v)
		}
	}
	rows := func(size int) { // one row per cell, in cell order
		for _, k := range keep {
			row := r.take(size)
			if k && write {
				dst = append(dst, row...)
			}
		}
	}
	vTrans, layers := r.u32(), r.u32()
	u32(vTrans)
	u32(layers)
	for range layers {
		u32(r.u32()) // type
		size := r.u64()
		u32(uint32(size))
		u32(uint32(size >> 32))
		rows(int(size))
	}
	for range layers {
		u32(r.u32()) // type
		if vTrans == 0 {
			size := r.u64()
			u32(uint32(size))
			u32(uint32(size >> 32))
			rows(int(size))
			continue
		}
		el, width := r.u32(), r.u32()
		u32(el)
		u32(width)
		for range width { // element j of every cell, in cell order
			rows(int(el))
		}
	}
	return dst, !r.bad
}
