package engine

import (
	"encoding/binary"
	"errors"
	"math"
	"time"

	"github.com/meshnet/shardd/backend"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/argmax"
	"github.com/meshnet/shardd/internal/tensorname"
	"github.com/meshnet/shardd/internal/wireerr"
	"github.com/meshnet/shardd/kvcache"
	"github.com/meshnet/shardd/stages/dtype"
)

// forwardOutcome is what became of a planned forward: how long it took, its
// error, and the backend's output for its rows (read by advance only).
type forwardOutcome struct {
	took time.Duration
	err  error
	out  *backend.Output
}

// advance takes in the outcome of the planned forward: the cost model,
// then the rows' outputs (or a rewind after a preemption, or the failure).
// The items it completes or fails are answered in s.fx.
func (s *scheduler) advance(o forwardOutcome) {
	run, took, err := s.fwd, o.took, o.err
	if err == nil {
		if run.rows <= costMaxRows {
			s.cost.add(run.rows, took)
		}
		if run.decodes > 0 {
			s.sinceDecodeOnly++
			if run.rows == s.lastDecodeRows {
				s.sinceDecodeOnly = 0
				s.decodeOnly.t.add(took)
				s.decodeOnly.rows.add(time.Duration(run.rows))
			} else if alone, ok := s.decodeTime(s.lastDecodeRows); ok && s.decodeOnly.t.ok {
				d := max(took-alone, 0) / time.Duration(run.rows-s.lastDecodeRows)
				if run.probe {
					s.besideRow = ewma{v: d, ok: true} // a fresh price after none for a while
				} else {
					s.besideRow.add(besideSample(d, s.besideRow))
				}
			}
		}
		if run.limit > 0 {
			s.budgetRuns++
			if took <= run.limit {
				s.budgetHits++
			}
		}
	}
	switch {
	case errors.Is(err, backend.ErrPreempted):
		s.rewindPlanned()
		s.preemptions++
		s.preempted = true
		return
	case err != nil:
		s.failPlanned(err)
		return
	}
	if run.decodes == 0 {
		s.preempted = false // a prefill-only iteration ran to its end
	}
	s.distribute(o.out)
}

// besideSample is a measured price of a prefill row beside decode rows as
// the average takes it: no more than 4x the average so far. A forward the
// host stalled (kdamond took 250 ms in one run) would otherwise move it
// 30x in one sample; a real rise still shows within a few.
func besideSample(d time.Duration, avg ewma) time.Duration {
	if avg.ok {
		d = min(d, 4*avg.v)
	}
	return d
}

// rewindPlanned undoes a preempted iteration: every planned item goes back
// to where it stood before it (its rows are run again later).
func (s *scheduler) rewindPlanned() {
	for _, p := range s.planned {
		s.fx.trim(p.w.seq, p.w.first+p.w.done)
	}
}

// distribute copies each planned item's outputs from out and completes
// finished items.
func (s *scheduler) distribute(out *backend.Output) {
	info := &s.info
	h, vocab := info.Hidden, info.Vocab
	row, logitRow := 0, 0
	for _, p := range s.planned {
		w := p.w
		if w.out == nil {
			w.out = s.pool.Alloc(s.outBytes(w))
			w.out.SetLen(0)
		}
		buf := w.out.Bytes()
		if info.LogitsOut {
			nOut := 0
			for r := p.from; r < p.from+p.n; r++ {
				if w.rowWantsOutput(r) {
					nOut++
				}
			}
			rows := out.Logits[logitRow*vocab : (logitRow+nOut)*vocab]
			if w.topK > 0 {
				buf = s.appendTop(w, buf, rows)
			} else {
				buf = dtype.AppendF32Bytes(buf, rows)
			}
			logitRow += nOut
			w.outRows += nOut
		} else {
			rows := out.Hidden[row*h : (row+p.n)*h]
			if s.cfg.Boundary == shardv1.DType_DTYPE_FLOAT32 {
				buf = dtype.AppendF32Bytes(buf, rows)
			} else {
				buf = dtype.AppendF32ToBF16(buf, rows)
			}
			w.outRows += p.n
		}
		w.out.SetLen(len(buf)) // appended in place: outBytes sized the buffer
		row += p.n
		w.done += p.n
		if w.done == w.tokens {
			s.complete(w)
		}
	}
}

// appendTop appends the compact output of logits rows (vocab wide): each
// row's K best logits to buf, their ids to w.topIDs (complete puts them
// after the values).
func (s *scheduler) appendTop(w *work, buf []byte, rows []float32) []byte {
	vocab := s.info.Vocab
	for r := 0; r+vocab <= len(rows); r += vocab {
		row := rows[r : r+vocab]
		s.topIdx, s.topHeap = argmax.TopK(s.topIdx, s.topHeap, row, w.topK)
		for _, id := range s.topIdx {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(row[id]))
		}
		w.topIDs = append(w.topIDs, s.topIdx...)
	}
	return buf
}

// outBytes is the size of w's whole output.
func (s *scheduler) outBytes(w *work) int {
	if s.info.LogitsOut && w.topK > 0 {
		return 8 * w.outputRows() * w.topK
	}
	if s.info.LogitsOut {
		return 4 * w.outputRows() * s.info.Vocab
	}
	return dtype.Size(s.cfg.Boundary) * w.tokens * s.info.Hidden
}

// complete records a finished item and sends its result.
func (s *scheduler) complete(w *work) {
	now := s.now()
	w.releaseInput()
	r := newResult(resultFields{
		workID: w.workID, session: w.st.id, step: w.step, epoch: w.epoch,
		phase: w.phase, mode: w.mode, first: w.first, tokens: w.tokens, chunk: w.chunk, deadline: w.deadline,
		body: w.out, outPos: w.outPos, execNanos: uint64(now.Sub(w.started)), cacheHit: w.hit,
		prefixRows: w.prefixRows,
		tm:         w.tm, bytesIn: w.bytesIn,
	})
	if s.timing {
		r.tm.completed = now
	}
	w.out = nil
	if s.info.LogitsOut && w.topK > 0 {
		// The values, then the ids: sendResult frames them as two tensors.
		buf := r.body.Bytes()
		for _, id := range w.topIDs {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(id))
		}
		r.body.SetLen(len(buf))
		r.name, r.dtype, r.shape = tensorname.TopValues, shardv1.DType_DTYPE_FLOAT32, [2]int64{int64(w.outRows), int64(w.topK)}
		r.outPos, r.topK = nil, w.topK
	} else if s.info.LogitsOut {
		r.name, r.dtype, r.shape = tensorname.Logits, shardv1.DType_DTYPE_FLOAT32, [2]int64{int64(w.outRows), int64(s.info.Vocab)}
		r.outPos = nil
	} else {
		r.name, r.dtype, r.shape = tensorname.Hidden, s.cfg.Boundary, [2]int64{int64(w.tokens), int64(s.info.Hidden)}
	}
	if w.mode == shardv1.CacheMode_CACHE_MODE_STATELESS {
		s.fx.trim(s.scratch, 0)
		s.owner = nil
	} else {
		sess := w.sess
		sess.LastStep, sess.HasStep = w.step, true
		if w.mode == shardv1.CacheMode_CACHE_MODE_PREFILL {
			sess.PrefillDone = w.final
		}
		s.prefixDone(w, r.body.Bytes())
		if w.mode == shardv1.CacheMode_CACHE_MODE_DECODE || sess.PrefillDone {
			s.gather.done(w.st.id, now)
		}
		r.pastLen = uint64(sess.PastLen)
		s.results.Put(resultKey{w.st.id, w.epoch, w.step}, r.ref(), r.cost())
		s.keepRecent(sess, kvcache.StepRef{Epoch: w.epoch, Step: w.step})
	}
	s.fx.deliver(w.st, reply{res: r}, true)
	s.finish(w)
}

// finish pops w (the head of its session's queue).
func (s *scheduler) finish(w *work) {
	if q := s.queues[w.st.id]; q != nil && len(q.items) > 0 && q.items[0] == w {
		s.pop(q)
	}
	s.retire(w)
}

// failPlanned answers every planned item with err after a failed forward and
// rewinds the sessions to where each item began.
func (s *scheduler) failPlanned(err error) {
	werr := wireerr.Wrap(ErrForward, err)
	if errors.Is(err, backend.ErrKVFull) {
		werr = ErrKVFull
	}
	seen := map[*work]bool{}
	for _, p := range s.planned {
		if seen[p.w] {
			continue
		}
		seen[p.w] = true
		s.fail(p.w, werr)
	}
}

// fail answers an admitted item with err, undoing its KV reservation.
func (s *scheduler) fail(w *work, err error) {
	if w.mode == shardv1.CacheMode_CACHE_MODE_STATELESS {
		s.fx.trim(s.scratch, 0)
		s.owner = nil
	} else if w.sess != nil {
		s.fx.trim(w.seq, w.first)
		s.store.Truncate(w.sess, w.first)
		s.prefixDrop(w.st.id)
	}
	s.refuse(w, err)
	s.finish(w)
}
