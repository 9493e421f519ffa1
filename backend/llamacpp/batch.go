package llamacpp

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/stages/dtype"
)

// batch is a llama_batch in C memory with Go views of its arrays. Rows are
// written straight into the C arrays; nothing is copied at Forward.
type batch struct {
	owner *Backend
	c     C.struct_llama_batch
	max   int
	embd  int // floats per row; 0 for token batches
	n     int
	outs  int

	tokens []C.llama_token
	hidden []float32
	pos    []C.llama_pos
	nSeq   []C.int32_t
	seq    []*C.llama_seq_id
	logits []C.int8_t
}

// NewBatch allocates a batch of MaxBatch rows in C memory.
func (b *Backend) NewBatch() (backend.Batch, error) {
	embd := 0
	if !b.info.TokensIn {
		embd = b.info.Hidden
	}
	n := b.info.MaxBatch
	bt := &batch{owner: b, max: n, embd: embd}
	bt.c = C.llama_batch_init(C.int32_t(n), C.int32_t(embd), 1)
	if (embd == 0 && bt.c.token == nil) || (embd != 0 && bt.c.embd == nil) || bt.c.pos == nil ||
		bt.c.seq_id == nil || bt.c.logits == nil || bt.c.n_seq_id == nil {
		C.llama_batch_free(bt.c)
		return nil, fmt.Errorf("%w: could not allocate a batch of %d rows", backend.ErrForward, n)
	}
	if embd == 0 {
		bt.tokens = unsafe.Slice(bt.c.token, n)
	} else {
		bt.hidden = unsafe.Slice((*float32)(unsafe.Pointer(bt.c.embd)), n*embd)
	}
	bt.pos = unsafe.Slice(bt.c.pos, n)
	bt.nSeq = unsafe.Slice(bt.c.n_seq_id, n)
	bt.seq = unsafe.Slice(bt.c.seq_id, n)
	bt.logits = unsafe.Slice(bt.c.logits, n)
	return bt, nil
}

// FreeBatch frees a batch from NewBatch.
func (b *Backend) FreeBatch(bb backend.Batch) {
	if bt, ok := bb.(*batch); ok && bt.owner == b && bt.max > 0 {
		C.llama_batch_free(bt.c)
		*bt = batch{}
	}
}

func (bt *batch) Len() int     { return bt.n }
func (bt *batch) Outputs() int { return bt.outs }
func (bt *batch) Reset()       { bt.n, bt.outs = 0, 0 }

func (bt *batch) row(seq, pos int, output bool) (int, error) {
	if bt.n >= bt.max {
		return 0, backend.ErrBatchFull
	}
	if seq < 0 || seq >= bt.owner.info.MaxSeqs {
		return 0, fmt.Errorf("%w: sequence %d", backend.ErrInput, seq)
	}
	// A hidden-producing shard must keep every row through its last layer.
	if !bt.owner.info.LogitsOut {
		output = true
	}
	i := bt.n
	bt.pos[i] = C.llama_pos(pos)
	bt.nSeq[i] = 1
	*bt.seq[i] = C.llama_seq_id(seq)
	bt.logits[i] = 0
	if output {
		bt.logits[i] = 1
		bt.outs++
	}
	bt.n++
	return i, nil
}

// AddToken adds a token row; only a shard holding layer 0 takes tokens.
func (bt *batch) AddToken(seq, pos int, token int32, output bool) error {
	if bt.embd != 0 {
		return fmt.Errorf("%w: this shard takes hidden states, not token ids", backend.ErrInput)
	}
	if token < 0 || int(token) >= bt.owner.info.Vocab {
		return fmt.Errorf("%w: token %d outside the vocabulary of %d", backend.ErrInput, token, bt.owner.info.Vocab)
	}
	i, err := bt.row(seq, pos, output)
	if err != nil {
		return err
	}
	bt.tokens[i] = C.llama_token(token)
	return nil
}

// AddHiddenBF16 converts one bf16 row straight into the batch's memory.
func (bt *batch) AddHiddenBF16(seq, pos int, row []byte, output bool) error {
	dst, err := bt.hiddenRow(seq, pos, len(row)/2, len(row)%2 == 0, output)
	if err != nil {
		return err
	}
	dtype.AppendBF16ToF32(dst, row)
	return nil
}

// AddHiddenF32 copies one float32 row into the batch's memory.
func (bt *batch) AddHiddenF32(seq, pos int, row []float32, output bool) error {
	dst, err := bt.hiddenRow(seq, pos, len(row), true, output)
	if err != nil {
		return err
	}
	copy(dst[:len(row)], row)
	return nil
}

// hiddenRow claims the next row and returns its storage as an empty slice
// with capacity for one row.
func (bt *batch) hiddenRow(seq, pos, elems int, whole, output bool) ([]float32, error) {
	if bt.embd == 0 {
		return nil, fmt.Errorf("%w: this shard takes token ids, not hidden states", backend.ErrInput)
	}
	if !whole || elems != bt.embd {
		return nil, fmt.Errorf("%w: hidden row of %d elements, want %d", backend.ErrInput, elems, bt.embd)
	}
	i, err := bt.row(seq, pos, output)
	if err != nil {
		return nil, err
	}
	return bt.hidden[i*bt.embd : i*bt.embd : (i+1)*bt.embd], nil
}
