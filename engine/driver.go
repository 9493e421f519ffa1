package engine

import (
	"bytes"
	"errors"
	"time"

	"github.com/meshnet/shardd/backend"
)

// driver is the scheduler's goroutine: the only part of the engine that
// touches the backend. It takes submitted work and control operations into
// the scheduler's state, asks the state for a plan, runs the planned
// forward, hands the outcome back, and carries out the effects each change
// of state recorded (apply): trims in the backend, replies to streams, the
// queue count, the published figures. The state (scheduler) holds none of
// these; it decides, the driver does.
type driver struct {
	e     *Engine
	s     *scheduler
	be    backend.Backend
	batch backend.Batch
	out   backend.Output
	// backup holds a sequence's cells while a prefix load replaces them;
	// saved and cut a state on its way to becoming a prefix cache entry.
	backup, saved, cut []byte
	// stats are the figures publish makes public (Engine.Stats).
	stats Stats
}

// init allocates the forward batch.
func (d *driver) init(e *Engine) error {
	d.e, d.s, d.be = e, &e.sched, e.be
	b, err := d.be.NewBatch()
	d.batch = b
	return err
}

func (d *driver) run() {
	e, s := d.e, d.s
	defer close(e.stopped)
	sweep := time.NewTicker(time.Second)
	defer sweep.Stop()
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	for {
		if s.pending == 0 || !s.wake.IsZero() {
			var woke <-chan time.Time
			if !s.wake.IsZero() {
				hold.Reset(time.Until(s.wake))
				woke = hold.C
			}
			select {
			case w := <-e.submitQ:
				s.enqueue(w)
			case op := <-e.control:
				d.runOp(op)
			case <-sweep.C:
				d.sweep()
			case <-woke:
			case <-e.stop:
				d.shutdown()
				return
			}
			hold.Stop()
			s.wake = time.Time{}
		}
		// Take everything else that is ready without waiting. (Go has no
		// conditional default, hence the second select.)
		for more := true; more; {
			select {
			case w := <-e.submitQ:
				s.enqueue(w)
			case op := <-e.control:
				d.runOp(op)
			case <-sweep.C:
				d.sweep()
			case <-e.stop:
				d.shutdown()
				return
			default:
				more = false
			}
		}
		if s.pending > 0 && d.batch != nil {
			d.step()
		}
	}
}

// step asks the state for one iteration and, when it has rows, runs the
// forward and hands its outcome back; the effects of each are carried out
// in between.
func (d *driver) step() {
	fp, run := d.s.plan(d.s.now())
	d.settle(0)
	if d.s.loadFailed {
		d.s.loadFailed = false
		if run {
			d.s.rewindPlanned() // nothing ran; every item is planned again
			d.settle(0)
		}
		return
	}
	if !run {
		return
	}
	took, err := d.forward(fp)
	d.s.advance(forwardOutcome{took: took, err: err, out: &d.out})
	if err != nil && !errors.Is(err, backend.ErrPreempted) {
		d.e.log.Error("forward failed", "rows", fp.rows, "err", err)
	}
	d.settle(fp.rows)
}

// sweep evicts expired sessions and publishes the store's figures.
func (d *driver) sweep() {
	d.s.store.Sweep()
	d.settle(0)
}

// runOp runs a control operation (cancel, release, a query) after taking in
// all submitted work, so the operation sees every item submitted before it.
func (d *driver) runOp(op func()) {
	for {
		select {
		case w := <-d.e.submitQ:
			d.s.enqueue(w)
			continue
		default:
		}
		break
	}
	op()
	d.settle(0)
}

// forward fills the batch with the planned rows and runs it: the only call
// that waits on the backend.
func (d *driver) forward(fp forwardPlan) (time.Duration, error) {
	d.batch.Reset()
	for _, p := range fp.items {
		if err := d.fill(p); err != nil {
			return 0, err
		}
	}
	var err error
	start := time.Now()
	if pb, ok := d.be.(backend.Preemptible); ok && fp.preemptible {
		err = pb.ForwardPreemptible(d.batch, &d.out)
	} else {
		err = d.be.Forward(d.batch, &d.out)
	}
	took := time.Since(start)
	d.stats.Busy += took
	return took, err
}

// fill adds planned rows [p.from, p.from+p.n) of p.w to the batch.
func (d *driver) fill(p planned) error {
	info := d.e.info
	h := info.Hidden
	w := p.w
	for r := p.from; r < p.from+p.n; r++ {
		pos := w.first + r
		out := info.LogitsOut && w.rowWantsOutput(r)
		var err error
		switch {
		case info.TokensIn:
			err = d.batch.AddToken(w.seq, pos, w.tokenIDs[r], out)
		case w.hiddenF:
			err = d.batch.AddHiddenF32(w.seq, pos, f32s(w.hiddenB[4*r*h:4*(r+1)*h]), out)
		default:
			err = d.batch.AddHiddenBF16(w.seq, pos, w.hiddenB[2*r*h:2*(r+1)*h], out)
		}
		if err != nil {
			return err // inputs were validated and plan keeps to MaxBatch: a bug
		}
	}
	return nil
}

// apply carries out the recorded effects: trims first (a trimmed cell
// must be gone before any peer learns its work ended), then deliveries in
// the order they were decided, then the queue count of the items they
// ended (so Drain sees an empty queue only once every reply is handed
// over), and last the items go back to their pool. Deliveries never block
// (stream.deliver).
func (d *driver) apply() {
	fx := &d.s.fx
	for _, sv := range fx.saves {
		d.save(sv)
	}
	for _, t := range fx.trims {
		d.be.SeqTrim(t.seq, t.pos)
	}
	for _, l := range fx.loads {
		d.load(l)
	}
	for _, dl := range fx.deliveries {
		dl.st.deliver(dl.r, dl.work)
	}
	if n := len(fx.retired); n > 0 {
		d.e.queued.Add(-int32(n))
	}
	for _, w := range fx.retired {
		w.recycle()
	}
	fx.reset()
}

// save makes a prefix cache entry from a sequence's state.
func (d *driver) save(sv saveOp) {
	ss, ok := d.be.(backend.SeqStater)
	if !ok || d.s.prefix == nil {
		return
	}
	state, err := ss.SeqSave(d.saved[:0], sv.seq)
	d.saved = state[:0]
	if err != nil {
		d.e.log.Warn("prefix cache: could not save a sequence", "err", err)
		return
	}
	// Only the blocks whose cells the sequence holds, each in position
	// order, are a lone run's bits: a chain may have been fed rows that
	// never ran (a chunk preempted, then cancelled), and in a shared KV
	// buffer a session's later positions can land in earlier cells.
	c := d.s.prefix
	blocks := min(sv.blocks, ss.SeqInOrder(state)/c.block)
	if blocks < sv.blocks {
		c.unordered++
	}
	if blocks == 0 {
		return
	}
	// The entry holds its blocks' cells and no more, so a load trims none
	// and leaves no hole for a later row to land in before them.
	cut, err := ss.SeqCut(d.cut[:0], state, blocks*c.block)
	d.cut = cut[:0]
	if err != nil {
		d.e.log.Warn("prefix cache: could not cut a sequence's state", "err", err)
		return
	}
	// A copy of its own size: the cache counts its entries' bytes.
	c.insert(sv.chain, blocks, bytes.Clone(cut))
}

// load puts a prefix cache entry's state into a sequence in place of its
// cells. When it does not fit, the sequence gets its own cells back and
// the scheduler runs the rows itself (undo).
func (d *driver) load(l loadOp) {
	ss := d.be.(backend.SeqStater) // the scheduler loads only through one
	var err error
	d.backup = d.backup[:0]
	if l.first > 0 {
		if d.backup, err = ss.SeqSave(d.backup, l.seq); err != nil {
			l.undo()
			return
		}
	}
	d.be.SeqTrim(l.seq, 0)
	if err = ss.SeqLoad(l.seq, l.state); err == nil {
		err = d.be.SeqTrim(l.seq, l.to)
	}
	if err == nil {
		return
	}
	d.be.SeqTrim(l.seq, 0)
	if l.first > 0 {
		if err := ss.SeqLoad(l.seq, d.backup); err != nil {
			d.e.log.Error("prefix cache: could not restore a sequence", "err", err)
		}
	}
	l.undo()
}

// settle publishes the state's figures and then carries out the effects,
// so a peer that reads Health after its reply sees the state the reply
// reports (the queue count alone still falls after delivery, for Drain).
func (d *driver) settle(rows int) {
	d.publish(rows)
	d.apply()
	d.checkPositions()
}

// publish makes the scheduler's Stats (with the driver's occupancy and
// busy time) the ones Health and the metrics read; rows is the forward
// just run (0: none).
func (d *driver) publish(rows int) {
	if rows > 0 {
		d.stats.Occupancy = rows
		d.e.obs.recordOccupancy(rows)
	}
	d.s.stats(&d.stats)
	d.e.published.set(&d.stats)
}

// shutdown answers everything still queued with CANCELLED, frees the
// state's results and the batch.
func (d *driver) shutdown() {
	d.s.shutdown()
	d.publish(0)
	d.apply()
	if d.batch != nil {
		d.be.FreeBatch(d.batch)
		d.batch = nil
	}
}
