package engine

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/engine/sched"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/argmax"
	"github.com/meshnet/shardd/internal/tensorname"
	"github.com/meshnet/shardd/stages/dtype"
)

// The output of work: each forward's rows appended to their items'
// buffers (collect), and a finished item's result (complete, the
// scheduler's Hooks.Complete).

// collect appends each planned item's rows of out to its output (a
// buffer of its whole output's size, taken on its first rows), before
// the scheduler takes in the forward.
func (d *driver) collect(fp sched.Forward, out *backend.Output) {
	info := &d.e.info
	h, vocab := info.Hidden, info.Vocab
	row, logitRow := 0, 0
	for _, p := range fp.Items {
		w := p.Item.Owner.(*work)
		if w.Out == nil {
			w.Out = d.e.pool.Alloc(w.OutBytes)
			w.Out.SetLen(0)
		}
		buf := w.Out.Bytes()
		if info.LogitsOut {
			nOut := 0
			for r := p.From; r < p.From+p.N; r++ {
				if w.RowWantsOutput(r) {
					nOut++
				}
			}
			rows := out.Logits[logitRow*vocab : (logitRow+nOut)*vocab]
			if w.topK > 0 {
				buf = d.appendTop(w, buf, rows)
			} else {
				buf = dtype.AppendF32Bytes(buf, rows)
			}
			logitRow += nOut
			w.OutRows += nOut
		} else {
			rows := out.Hidden[row*h : (row+p.N)*h]
			if d.e.cfg.Boundary == shardv1.DType_DTYPE_FLOAT32 {
				buf = dtype.AppendF32Bytes(buf, rows)
			} else {
				buf = dtype.AppendF32ToBF16(buf, rows)
			}
			w.OutRows += p.N
		}
		w.Out.SetLen(len(buf)) // appended in place: outBytes sized the buffer
		row += p.N
	}
}

// appendTop appends the compact output of logits rows (vocab wide): each
// row's K best logits to buf, their ids to w.topIDs (complete puts them
// after the values).
func (d *driver) appendTop(w *work, buf []byte, rows []float32) []byte {
	vocab := d.e.info.Vocab
	for r := 0; r+vocab <= len(rows); r += vocab {
		row := rows[r : r+vocab]
		d.topIdx, d.topHeap = argmax.TopK(d.topIdx, d.topHeap, row, w.topK)
		for _, id := range d.topIdx {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(row[id]))
		}
		w.topIDs = append(w.topIDs, d.topIdx...)
	}
	return buf
}

// outBytes is the size of w's whole output.
func (e *Engine) outBytes(w *work) int {
	if e.info.LogitsOut && w.topK > 0 {
		return 8 * w.OutputRows() * w.topK
	}
	if e.info.LogitsOut {
		return 4 * w.OutputRows() * e.info.Vocab
	}
	return dtype.Size(e.cfg.Boundary) * w.Tokens * e.info.Hidden
}

// complete makes a finished item's result, taking over its output
// (sched.Hooks.Complete).
func (e *Engine) complete(it *sched.Item, now time.Time, pastLen uint64) sched.Output {
	w := it.Owner.(*work)
	w.releaseInput()
	w.tm.started = w.Started
	r := newResult(resultFields{
		workID: w.WorkID, session: w.Session, step: w.Step, epoch: w.Epoch,
		phase: w.phase, mode: cacheMode(w.Mode), first: w.First, tokens: w.Tokens, chunk: w.chunk, deadline: w.Deadline,
		body: w.Out, outPos: w.OutPos, execNanos: uint64(now.Sub(w.Started)), cacheHit: w.Hit,
		prefixRows: w.PrefixRows, pastLen: pastLen,
		tm: w.tm, bytesIn: w.bytesIn,
	})
	if e.obs.on {
		r.tm.completed, r.tm.coreGBps = now, e.drv.stats.CoreGBps
	}
	switch {
	case e.info.LogitsOut && w.topK > 0:
		// The values, then the ids: sendResult frames them as two tensors.
		buf := r.body.Bytes()
		for _, id := range w.topIDs {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(id))
		}
		r.body.SetLen(len(buf))
		r.name, r.dtype, r.shape = tensorname.TopValues, shardv1.DType_DTYPE_FLOAT32, [2]int64{int64(w.OutRows), int64(w.topK)}
		r.outPos, r.topK = nil, w.topK
	case e.info.LogitsOut:
		r.name, r.dtype, r.shape = tensorname.Logits, shardv1.DType_DTYPE_FLOAT32, [2]int64{int64(w.OutRows), int64(e.info.Vocab)}
		r.outPos = nil
	default:
		r.name, r.dtype, r.shape = tensorname.Hidden, e.cfg.Boundary, [2]int64{int64(w.Tokens), int64(e.info.Hidden)}
	}
	return r
}

// schedMode is the scheduler's name for a contract cache mode.
func schedMode(m shardv1.CacheMode) sched.Mode {
	switch m {
	case shardv1.CacheMode_CACHE_MODE_PREFILL:
		return sched.Prefill
	case shardv1.CacheMode_CACHE_MODE_DECODE:
		return sched.Decode
	case shardv1.CacheMode_CACHE_MODE_STATELESS:
		return sched.Stateless
	}
	return sched.ModeUnknown
}

// cacheMode is the contract's name for a scheduler mode.
func cacheMode(m sched.Mode) shardv1.CacheMode {
	switch m {
	case sched.Prefill:
		return shardv1.CacheMode_CACHE_MODE_PREFILL
	case sched.Decode:
		return shardv1.CacheMode_CACHE_MODE_DECODE
	case sched.Stateless:
		return shardv1.CacheMode_CACHE_MODE_STATELESS
	}
	return shardv1.CacheMode_CACHE_MODE_UNSPECIFIED
}
