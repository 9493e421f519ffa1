package llamacpp

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync/atomic"

	"github.com/meshnet/shardd/backend"
)

// streams lays out a forward of several sequences on separate KV streams
// (Config.SeparateKV) as one llama.cpp ubatch. llama.cpp computes rows of
// separate streams together only when their stream ids are consecutive
// and in order, each with the same number of rows; anything else it splits
// into several ubatches, run one after another (the weights read again for
// each), and the captured hidden states come back in ubatch order, not
// batch order. So a batch of one row per sequence is copied into the
// padded batch in stream order, with a placeholder row for each stream
// in between that has room (at the position after its last, removed again
// after the forward: its cell is masked from every other row and then
// free). Every operation of the forward is batch-invariant (TestOpVariance),
// so neither the other rows nor the placeholders change a row's bits.
//
// Placeholders cost a row each, and the sessions a worker decodes together
// are rarely on consecutive streams: on a route they move round it in
// groups (one per stage), each group's sessions scattered over the
// streams. So a sequence is not tied to the stream of the same number:
// the engine's sequences are mapped onto streams, and when the sequences of
// a decode forward lie scattered (and did the time before: see compact),
// those outside the best run of streams swap streams with the sequences
// inside it before the forward runs. A swap copies a stream's every cell,
// bit for bit, to the same cells of the other (llama_memory_seq_cp across
// streams; the copy is done as the forward starts, before it reads the
// cache), so a sequence's cells keep their order and their bits and its
// results do not change; once the groups settle, their forwards need no
// placeholders (TestStreamsCompact).
type streams struct {
	batch *batch
	// at[i] is row i's index in the padded batch.
	at []int
	// placed lists the streams given a placeholder row, and from the
	// position it took.
	placed []placeholder
	// bySeq[s] is 1 + the row of sequence s in the batch being laid out.
	bySeq []int
	// hidden holds the forward's hidden rows in batch order.
	hidden []float32
	// stream[s] is the KV stream (llama.cpp's sequence id) holding the
	// engine's sequence s; seqOf is its inverse.
	stream, seqOf []int
	// in marks the streams of the forward being laid out; outside[s]
	// counts the forwards in a row that found sequence s outside its
	// forward's best run of streams.
	in      []bool
	outside []uint8
	// renamed: a single-sequence batch whose rows were given its stream
	// id, and the sequence to give back after the forward.
	renamed    *batch
	renamedSeq int
	stats      *streamStats
}

// streamStats counts placeholder rows run and stream copies made (atomic:
// the engine's metrics read them from another goroutine).
type streamStats struct{ placeholders, copies atomic.Int64 }

type placeholder struct{ stream, pos int }

func newStreams(b *Backend) (*streams, error) {
	bb, err := b.NewBatch()
	if err != nil {
		return nil, err
	}
	n := b.info.MaxSeqs
	st := &streams{batch: bb.(*batch), at: make([]int, b.info.MaxBatch), bySeq: make([]int, n),
		stream: make([]int, n), seqOf: make([]int, n), in: make([]bool, n), outside: make([]uint8, n),
		stats: &b.streamStats}
	for s := range n {
		st.stream[s], st.seqOf[s] = s, s
	}
	if !b.info.LogitsOut {
		st.hidden = make([]float32, b.info.MaxBatch*b.info.Hidden)
	}
	return st, nil
}

// layout returns the batch to run for bt, with stream ids in place of the
// engine's sequence numbers: bt itself when it holds one sequence (its
// rows renamed until release), else the padded batch. Rows of several
// sequences must be one per sequence.
func (st *streams) layout(b *Backend, bt *batch) (*batch, error) {
	if bt.n == 0 {
		return bt, nil
	}
	first := int(*bt.seq[0])
	several := false
	for i := range bt.n {
		several = several || int(*bt.seq[i]) != first
	}
	if !several {
		if k := st.stream[first]; k != first {
			for i := range bt.n {
				*bt.seq[i] = C.llama_seq_id(k)
			}
			st.renamed, st.renamedSeq = bt, first
		}
		return bt, nil
	}
	defer clear(st.bySeq)
	mem := C.llama_get_memory(b.ctx)
	steps := true // every row continues its sequence: the forward will run
	for i := range bt.n {
		s := int(*bt.seq[i])
		if st.bySeq[s] != 0 {
			return nil, fmt.Errorf("%w: on separate KV streams, a forward of several sequences takes one row of each", backend.ErrInput)
		}
		st.bySeq[s] = i + 1
		steps = steps && int(bt.pos[i]) == st.posMax(mem, st.stream[s])+1
	}
	if steps {
		st.compact(mem, bt)
	}
	lo, hi := len(st.stream), -1
	for i := range bt.n {
		k := st.stream[*bt.seq[i]]
		lo, hi = min(lo, k), max(hi, k)
	}
	room := b.info.CtxTokens / max(b.info.MaxSeqs, 1)
	pad := st.batch
	pad.Reset()
	st.placed = st.placed[:0]
	fill := hi-lo+1 <= pad.max
	for k := lo; k <= hi; k++ {
		if i := st.bySeq[st.seqOf[k]] - 1; i >= 0 {
			st.at[i] = pad.n
			if err := pad.copyRow(bt, i, k); err != nil {
				return nil, err
			}
			continue
		}
		pos := st.posMax(mem, k) + 1
		if !fill || pos >= room {
			continue // the ubatch splits here; the order still holds
		}
		if err := pad.placeholder(k, pos); err != nil {
			return nil, err
		}
		st.placed = append(st.placed, placeholder{stream: k, pos: pos})
	}
	st.stats.placeholders.Add(int64(len(st.placed)))
	return pad, nil
}

func (st *streams) posMax(mem C.llama_memory_t, k int) int {
	return int(C.llama_memory_seq_pos_max(mem, C.llama_seq_id(k)))
}

// compact moves the sequences of bt (one decode row each) towards
// consecutive streams: it finds the run of as many streams that holds the
// most of them, and swaps each sequence outside it with a stream inside
// it that is not the forward's. A sequence moves only when the forward
// before the one it was last in also found it outside: a session that
// once comes late to its group's forward is not copied there and back.
func (st *streams) compact(mem C.llama_memory_t, bt *batch) {
	n, k := len(st.stream), bt.n
	clear(st.in)
	for i := range bt.n {
		st.in[st.stream[*bt.seq[i]]] = true
	}
	best, at, count := -1, 0, 0
	for j := range n {
		if st.in[j] {
			count++
		}
		if j >= k && st.in[j-k] {
			count--
		}
		if j >= k-1 && count > best {
			best, at = count, j-k+1
		}
	}
	hole := at
	for p := range n {
		if !st.in[p] {
			continue
		}
		s := st.seqOf[p]
		if p >= at && p < at+k {
			st.outside[s] = 0
			continue
		}
		if st.outside[s] < 2 {
			st.outside[s]++
		}
		if st.outside[s] < 2 {
			continue
		}
		for hole < at+k && st.in[hole] {
			hole++
		}
		if hole == at+k || !st.swap(mem, p, hole) {
			return
		}
		st.in[hole], st.in[p] = true, false
		st.outside[s] = 0
	}
}

// swap exchanges the cells of streams p and w and the sequences they
// hold, through a third stream that holds none when both hold cells. It
// reports false when it needs one and there is none.
func (st *streams) swap(mem C.llama_memory_t, p, w int) bool {
	fullP, fullW := st.posMax(mem, p) >= 0, st.posMax(mem, w) >= 0
	cp := func(from, to int) {
		C.llama_memory_seq_cp(mem, C.llama_seq_id(from), C.llama_seq_id(to), -1, -1)
		C.llama_memory_seq_rm(mem, C.llama_seq_id(from), -1, -1)
		st.stats.copies.Add(1)
	}
	switch {
	case fullP && fullW:
		t := -1
		for j := range st.stream {
			if j != p && j != w && st.posMax(mem, j) < 0 {
				t = j
				break
			}
		}
		if t < 0 {
			return false
		}
		cp(p, t)
		cp(w, p)
		cp(t, w)
	case fullP:
		cp(p, w)
	case fullW:
		cp(w, p)
	}
	x, y := st.seqOf[p], st.seqOf[w]
	st.stream[x], st.stream[y] = w, p
	st.seqOf[p], st.seqOf[w] = y, x
	return true
}

// release removes the placeholders' cells and gives a renamed batch its
// sequence back.
func (st *streams) release(b *Backend) {
	for _, p := range st.placed {
		C.shardd_seq_rm(b.ctx, C.int32_t(p.stream), C.int32_t(p.pos))
	}
	st.placed = st.placed[:0]
	if bt := st.renamed; bt != nil {
		for i := range bt.n {
			*bt.seq[i] = C.llama_seq_id(st.renamedSeq)
		}
		st.renamed = nil
	}
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

// copyRow appends row i of src on stream k.
func (bt *batch) copyRow(src *batch, i, k int) error {
	j, err := bt.row(k, int(src.pos[i]), src.logits[i] != 0)
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

// placeholder appends a row for stream seq at pos whose result nobody reads:
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
