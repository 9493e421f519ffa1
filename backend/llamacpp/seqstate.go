package llamacpp

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
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
