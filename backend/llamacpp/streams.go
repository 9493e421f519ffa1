package llamacpp

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/meshnet/shardd/backend"
)

// streams lays out a forward of several sequences on separate KV streams
// (Config.SeparateKV) as one llama.cpp ubatch. llama.cpp computes rows of
// separate streams together only when their stream ids are consecutive
// and in order, each with the same number of rows; anything else it splits
// into several ubatches, run one after another (the weights read again for
// each), and the captured hidden states come back in ubatch order, not
// batch order. So a batch of as many rows of each sequence (decode steps:
// one each; prompt chunks of one length) is copied into the padded batch
// in stream order, with as many placeholder rows for each stream in
// between that has room (at the positions after its last, removed again
// after the forward: their cells are masked from every other row and then
// free), unless the gap would take more than gapRows of them: there the
// forward is cut, and each part runs as a llama_decode of its own (see
// cuts). Every operation of the forward is batch-invariant
// (TestOpVariance), so neither the other rows nor the placeholders change
// a row's bits.
//
// Placeholders cost a row each, and the sessions a worker decodes together
// are rarely on consecutive streams: on a route they move round it in
// groups (one per stage), each group's sessions scattered over the
// streams. So a sequence is not tied to the stream of the same number:
// the engine's sequences are mapped onto streams, and when the sequences of
// a forward lie scattered, they move onto consecutive streams before it
// runs (see compact for which and when). A move to a stream without cells
// of a sequence without cells only renames; any other copies a stream's
// every cell, bit for bit, to the same cells of the other
// (llama_memory_seq_cp across streams; the copy is done as the forward
// starts, before it reads the cache), so a sequence's cells keep their
// order and their bits and its results do not change. Once the groups
// settle, their forwards need no placeholders (TestStreamsCompact).
type streams struct {
	batch *batch
	// at[i] is row i's index in the padded batch.
	at []int
	// placed lists the streams given a placeholder row, and from the
	// position it took.
	placed []placeholder
	// bySeq[s] is 1 + the first row of sequence s in the batch being
	// laid out; seqs lists its sequences.
	bySeq []int
	seqs  []int
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
	// full marks the streams holding cells (compact's scratch).
	full []bool
	// renamed: a single-sequence batch whose rows were given its stream
	// id, and the sequence to give back after the forward.
	renamed    *batch
	renamedSeq int
	// cuts lists the rows of the padded batch where a llama_decode of its
	// own starts: after a gap between its streams, and before a ubatch's
	// rows (Backend.ubatch) would be exceeded. llama.cpp splits a batch whose
	// streams are not consecutive into ubatches itself, but it first finds
	// every ubatch's cells and then restores each stream's cell search
	// head from the wrong stream's (llama_kv_cache::prepare indexes the
	// saved heads by the stream's place in the ubatch, not by the stream);
	// a ubatch that runs sets its streams' heads right again, but when a
	// forward stops part way (a preemption), the streams of the ubatches
	// that did not run keep the wrong head, and their next cells go out of
	// position order, which changes the bits attention computes
	// (TestStreamsFailedForwardKeepsOrder). A llama_decode of one ubatch
	// is not exposed: its ubatch runs, or its slot search failed and
	// changed nothing.
	cuts  []int
	stats *streamStats
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
		stream: make([]int, n), seqOf: make([]int, n), in: make([]bool, n), outside: make([]uint8, n), full: make([]bool, n),
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
// sequences must be as many of each, each sequence's together and in
// position order.
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
	// Each sequence's rows: from bySeq[s]-1, n of them.
	st.seqs = st.seqs[:0]
	n := 0
	for i := 0; i < bt.n; {
		s := int(*bt.seq[i])
		j := i + 1
		for j < bt.n && int(*bt.seq[j]) == s && bt.pos[j] == bt.pos[j-1]+1 {
			j++
		}
		if st.bySeq[s] != 0 || (n != 0 && j-i != n) {
			return nil, fmt.Errorf("%w: on separate KV streams, a forward of several sequences takes as many rows of each, in position order", backend.ErrInput)
		}
		st.bySeq[s], n = i+1, j-i
		st.seqs = append(st.seqs, s)
		i = j
	}
	steps := true // every sequence's rows continue it: the forward will run
	for _, s := range st.seqs {
		steps = steps && int(bt.pos[st.bySeq[s]-1]) == st.posMax(mem, st.stream[s])+1
	}
	if steps {
		st.compact(mem)
	}
	return st.pad(b, bt, mem, n)
}

// pad lays bt's rows, n of each of st.seqs, into the padded batch in
// stream order, with placeholder rows in the gaps that take them, and
// records where the forward is cut (cuts).
func (st *streams) pad(b *Backend, bt *batch, mem C.llama_memory_t, n int) (*batch, error) {
	lo, hi := len(st.stream), -1
	for _, s := range st.seqs {
		lo, hi = min(lo, st.stream[s]), max(hi, st.stream[s])
	}
	room := b.info.CtxTokens / max(b.info.MaxSeqs, 1)
	pad := st.batch
	pad.Reset()
	st.placed, st.cuts = st.placed[:0], st.cuts[:0]
	placeholders, split := 0, false
	// cut starts a new llama_decode before the next n rows when the last
	// stream laid out is not the one before theirs, or when they would
	// take the current one past a ubatch.
	cut := func() {
		from := 0
		if len(st.cuts) > 0 {
			from = st.cuts[len(st.cuts)-1]
		}
		if pad.n > 0 && (split || pad.n-from+n > b.ubatch) {
			st.cuts = append(st.cuts, pad.n)
		}
		split = false
	}
	for k := lo; k <= hi; k++ {
		if i := st.bySeq[st.seqOf[k]] - 1; i >= 0 {
			cut()
			for r := i; r < i+n; r++ {
				st.at[r] = pad.n
				if err := pad.copyRow(bt, r, k); err != nil {
					return nil, err
				}
			}
			continue
		}
		// A gap: placeholders when they cost less than a ubatch of its
		// own (gapRows), else the forward is cut here (the order holds).
		gap := k
		for gap <= hi && st.bySeq[st.seqOf[gap]] == 0 {
			gap++
		}
		if (gap-k)*n > gapRows || (hi-lo+1)*n > pad.max {
			k, split = gap-1, true
			continue
		}
		pos := st.posMax(mem, k) + 1
		if pos+n > room {
			split = true
			continue
		}
		cut()
		for r := range n {
			if err := pad.placeholder(k, pos+r); err != nil {
				return nil, err
			}
		}
		st.placed = append(st.placed, placeholder{stream: k, pos: pos})
		placeholders += n
	}
	st.stats.placeholders.Add(int64(placeholders))
	return pad, nil
}

// gapRows is the most placeholder rows a gap between two streams of a
// forward gets: beyond it, a ubatch of its own (the weights streamed once
// more: on a CPU, about as long as 8 rows of the bench preset) costs less.
const gapRows = 8

func (st *streams) posMax(mem C.llama_memory_t, k int) int {
	return int(C.llama_memory_seq_pos_max(mem, C.llama_seq_id(k)))
}

// compact moves the sequences of the forward being laid out (st.seqs)
// towards consecutive streams. Where a run of as many streams holds
// only them and streams without cells, and the sequences outside it have
// no cells either (a group of sessions' first prompt chunks), they move
// there, which copies nothing. Else it finds the run that holds the most
// of them, and swaps each sequence outside it with a stream inside it
// that is not the forward's; a swap that copies cells is made only when
// the sequence's previous forward found it outside too, so a session that
// once comes late to its group's forward is not copied there and back.
func (st *streams) compact(mem C.llama_memory_t) {
	n, k := len(st.stream), len(st.seqs)
	lo, hi := n, -1
	for _, s := range st.seqs {
		lo, hi = min(lo, st.stream[s]), max(hi, st.stream[s])
	}
	if hi-lo+1 == k { // together already: a settled group's every step
		for _, s := range st.seqs {
			st.outside[s] = 0
		}
		return
	}
	clear(st.in)
	for _, s := range st.seqs {
		st.in[st.stream[s]] = true
	}
	fullMembers := 0
	for j := range n {
		st.full[j] = st.posMax(mem, j) >= 0
		if st.in[j] && st.full[j] {
			fullMembers++
		}
	}
	// Over each run of k streams: its members, its members with cells,
	// and its other streams with cells.
	best, at := -1, 0
	freeBest, freeAt := -1, 0
	members, fullIn, blocked := 0, 0, 0
	add := func(j, d int) {
		switch {
		case st.in[j]:
			members += d
			if st.full[j] {
				fullIn += d
			}
		case st.full[j]:
			blocked += d
		}
	}
	for j := range n {
		add(j, 1)
		if j >= k {
			add(j-k, -1)
		}
		if j < k-1 {
			continue
		}
		if members > best {
			best, at = members, j-k+1
		}
		if blocked == 0 && fullIn == fullMembers && members > freeBest {
			freeBest, freeAt = members, j-k+1
		}
	}
	free := freeBest >= 0
	if free {
		at = freeAt
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
		for hole < at+k && st.in[hole] {
			hole++
		}
		if hole == at+k {
			return
		}
		if st.outside[s] < 2 {
			st.outside[s]++
		}
		if !free && st.outside[s] < 2 && (st.full[p] || st.full[hole]) {
			continue
		}
		if !st.swap(mem, p, hole) {
			return
		}
		st.in[hole], st.in[p] = true, false
		st.outside[s] = 0
	}
}

// swap exchanges the cells of streams p and w and the sequences they
// hold (st.full says which streams hold cells), through a third stream
// that holds none when both hold cells. It reports false when it needs one
// and there is none.
func (st *streams) swap(mem C.llama_memory_t, p, w int) bool {
	cp := func(from, to int) {
		C.llama_memory_seq_cp(mem, C.llama_seq_id(from), C.llama_seq_id(to), -1, -1)
		C.llama_memory_seq_rm(mem, C.llama_seq_id(from), -1, -1)
		st.stats.copies.Add(1)
	}
	switch {
	case st.full[p] && st.full[w]:
		t := slices.IndexFunc(st.full, func(f bool) bool { return !f })
		if t < 0 {
			return false
		}
		cp(p, t)
		cp(w, p)
		cp(t, w)
	case st.full[p]:
		cp(p, w)
	case st.full[w]:
		cp(w, p)
	}
	x, y := st.seqOf[p], st.seqOf[w]
	st.stream[x], st.stream[y] = w, p
	st.seqOf[p], st.seqOf[w] = y, x
	st.full[p], st.full[w] = st.full[w], st.full[p]
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
