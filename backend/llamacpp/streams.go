package llamacpp

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"

	"github.com/meshnet/shardd/backend"
)

// streams lays out a forward of several sequences on separate KV streams
// (Config.SeparateKV) as one llama.cpp ubatch. llama.cpp computes rows of
// separate streams together only when their sequence ids are consecutive
// and in order, each with the same number of rows; anything else it splits
// into several ubatches, run one after another (the weights read again for
// each), and the captured hidden states come back in ubatch order, not
// batch order. So a batch of one row per sequence is copied into the
// padded batch in sequence order, with a placeholder row for each sequence
// in between that has room (at the position after its last, removed again
// after the forward: its cell is masked from every other row and then
// free). Every operation of the forward is batch-invariant (TestOpVariance),
// so neither the other rows nor the placeholders change a row's bits.
type streams struct {
	batch *batch
	// at[i] is row i's index in the padded batch.
	at []int
	// placed lists the sequences given a placeholder row, and from the
	// position it took.
	placed []placeholder
	// bySeq[s] is 1 + the row of sequence s in the batch being laid out.
	bySeq []int
	// hidden holds the forward's hidden rows in batch order.
	hidden []float32
}

type placeholder struct{ seq, pos int }

func newStreams(b *Backend) (*streams, error) {
	bb, err := b.NewBatch()
	if err != nil {
		return nil, err
	}
	st := &streams{batch: bb.(*batch), at: make([]int, b.info.MaxBatch), bySeq: make([]int, b.info.MaxSeqs)}
	if !b.info.LogitsOut {
		st.hidden = make([]float32, b.info.MaxBatch*b.info.Hidden)
	}
	return st, nil
}

// layout returns the batch to run for bt: bt itself when it holds one
// sequence, else the padded batch. Rows of several sequences must be one
// per sequence.
func (st *streams) layout(b *Backend, bt *batch) (*batch, error) {
	if bt.n < 2 {
		return bt, nil
	}
	first := int(*bt.seq[0])
	lo, hi, several := first, first, false
	for i := range bt.n {
		s := int(*bt.seq[i])
		several = several || s != first
		lo, hi = min(lo, s), max(hi, s)
	}
	if !several {
		return bt, nil
	}
	defer clear(st.bySeq)
	for i := range bt.n {
		s := int(*bt.seq[i])
		if st.bySeq[s] != 0 {
			return nil, fmt.Errorf("%w: on separate KV streams, a forward of several sequences takes one row of each", backend.ErrInput)
		}
		st.bySeq[s] = i + 1
	}
	mem := C.llama_get_memory(b.ctx)
	room := b.info.CtxTokens / max(b.info.MaxSeqs, 1)
	pad := st.batch
	pad.Reset()
	st.placed = st.placed[:0]
	fill := hi-lo+1 <= pad.max
	for s := lo; s <= hi; s++ {
		if i := st.bySeq[s] - 1; i >= 0 {
			st.at[i] = pad.n
			if err := pad.copyRow(bt, i); err != nil {
				return nil, err
			}
			continue
		}
		pos := int(C.llama_memory_seq_pos_max(mem, C.llama_seq_id(s))) + 1
		if !fill || pos >= room {
			continue // the ubatch splits here; the order still holds
		}
		if err := pad.placeholder(s, pos); err != nil {
			return nil, err
		}
		st.placed = append(st.placed, placeholder{seq: s, pos: pos})
	}
	return pad, nil
}

// release removes the placeholders' cells.
func (st *streams) release(b *Backend) {
	for _, p := range st.placed {
		C.shardd_seq_rm(b.ctx, C.int32_t(p.seq), C.int32_t(p.pos))
	}
	st.placed = st.placed[:0]
}

// gather copies the padded forward's hidden rows (n of width w, in padded
// order) back into batch order.
func (st *streams) gather(padded []float32, n, w int) []float32 {
	out := st.hidden[:n*w]
	for i := range n {
		copy(out[i*w:(i+1)*w], padded[st.at[i]*w:(st.at[i]+1)*w])
	}
	return out
}

// copyRow appends row i of src.
func (bt *batch) copyRow(src *batch, i int) error {
	j, err := bt.row(int(*src.seq[i]), int(src.pos[i]), src.logits[i] != 0)
	if err != nil {
		return err
	}
	if bt.embd == 0 {
		bt.tokens[j] = src.tokens[i]
	} else {
		copy(bt.hidden[j*bt.embd:(j+1)*bt.embd], src.hidden[i*bt.embd:(i+1)*bt.embd])
	}
	return nil
}

// placeholder appends a row for seq at pos whose result nobody reads:
// token 0, or a hidden state of zeros.
func (bt *batch) placeholder(seq, pos int) error {
	j, err := bt.row(seq, pos, false)
	if err != nil {
		return err
	}
	if bt.embd == 0 {
		bt.tokens[j] = 0
	} else {
		clear(bt.hidden[j*bt.embd : (j+1)*bt.embd])
	}
	return nil
}
