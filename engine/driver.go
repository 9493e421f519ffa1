package engine

import (
	"bytes"
	"errors"
	"strings"
	"time"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/engine/sched"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/hoststat"
	"github.com/meshnet/shardd/internal/wireerr"
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
	s     *sched.Scheduler
	be    backend.Backend
	batch backend.Batch
	out   backend.Output
	// topIdx and topHeap are appendTop's scratch (compact output).
	topIdx, topHeap []int32
	// backup holds a sequence's cells while a prefix load replaces them;
	// saved and cut a state on its way to becoming a prefix cache entry.
	backup, saved, cut []byte
	// stats are the figures publish makes public (Engine.Stats).
	stats Stats
	// clock is the time the driver gives the scheduler (time.Now; a
	// script's clock in tests).
	clock func() time.Time
	// coreA, coreB are the core probe's buffers; coreAt when it last ran.
	coreA, coreB []byte
	coreAt       time.Time
	// gate counts the results still being sent; sendTimer bounds the wait
	// for them; sendStuck: a wait ran out and forwards do not wait until
	// the gate empties (awaitSends).
	gate      *sendGate
	sendTimer *time.Timer
	sendStuck bool
}

// coreEvery is how often the driver probes its core's speed before a
// forward: the host's slow and fast spells last seconds (PERF.md, noise),
// and a probe costs 15-35 µs.
const coreEvery = 100 * time.Millisecond

// init allocates the forward batch.
func (d *driver) init(e *Engine) error {
	d.e, d.s, d.be = e, e.sched, e.be
	if d.clock == nil {
		d.clock = time.Now
	}
	d.coreA, d.coreB = hoststat.CoreBuffers()
	d.gate = newSendGate()
	b, err := d.be.NewBatch()
	d.batch = b
	return err
}

func (d *driver) run() {
	e, s := d.e, d.s
	e.schedMu.Lock()
	defer e.schedMu.Unlock()
	defer close(e.stopped) // before the unlock: open sees it under the lock
	sweep := time.NewTicker(time.Second)
	defer sweep.Stop()
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	for {
		if s.Pending() == 0 || !s.Wake().IsZero() {
			var woke <-chan time.Time
			if wake := s.Wake(); !wake.IsZero() {
				hold.Reset(time.Until(wake))
				woke = hold.C
			}
			var (
				w           *work
				op          func()
				swept, stop bool
			)
			e.schedMu.Unlock()
			select {
			case w = <-e.submitQ:
			case op = <-e.control:
			case <-sweep.C:
				swept = true
			case <-woke:
			case <-e.stop:
				stop = true
			}
			e.schedMu.Lock()
			switch {
			case w != nil:
				s.Enqueue(&w.Item, d.clock())
			case op != nil:
				d.runOp(op)
			case swept:
				d.sweep()
			case stop:
				d.shutdown()
				return
			}
			hold.Stop()
			s.ClearWake()
		}
		// Take everything else that is ready without waiting. (Go has no
		// conditional default, hence the second select.)
		for more := true; more; {
			select {
			case w := <-e.submitQ:
				s.Enqueue(&w.Item, d.clock())
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
		if s.Pending() > 0 && d.batch != nil {
			d.step()
		}
	}
}

// step asks the state for one iteration and, when it has rows, runs the
// forward and hands its outcome back; the effects of each are carried out
// in between.
func (d *driver) step() {
	fp, run := d.s.Plan(d.clock())
	d.settle(0)
	if d.s.LoadFailed() {
		d.settle(0) // nothing ran; every item is planned again
		return
	}
	if !run {
		return
	}
	took, err := d.forward(fp)
	d.advance(fp, took, err)
	d.settle(fp.Rows)
}

// advance hands a forward's outcome to the scheduler: the rows' outputs
// appended to their items, or its failure as the refusal its items get.
func (d *driver) advance(fp sched.Forward, took time.Duration, err error) {
	o := sched.Outcome{Took: took}
	switch {
	case err == nil:
		d.collect(fp, &d.out)
	case errors.Is(err, backend.ErrPreempted):
		o.Preempted = true
	case errors.Is(err, backend.ErrKVFull):
		d.e.log.Error("forward failed", "rows", fp.Rows, "err", err)
		o.Err = ErrKVFull
	default:
		d.e.log.Error("forward failed", "rows", fp.Rows, "err", err)
		o.Err = wireerr.Wrap(ErrForward, err)
	}
	d.s.Advance(d.clock(), o)
}

// sweep evicts expired sessions and publishes the store's figures.
func (d *driver) sweep() {
	d.s.Sweep(d.clock())
	d.settle(0)
}

// runOp runs a control operation (cancel, release, a query) after taking in
// all submitted work, so the operation sees every item submitted before it.
func (d *driver) runOp(op func()) {
	for {
		select {
		case w := <-d.e.submitQ:
			d.s.Enqueue(&w.Item, d.clock())
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
func (d *driver) forward(fp sched.Forward) (time.Duration, error) {
	d.batch.Reset()
	for _, p := range fp.Items {
		if err := d.fill(p); err != nil {
			return 0, err
		}
	}
	var err error
	// The state is not touched while the backend runs: open may read it.
	d.e.schedMu.Unlock()
	d.awaitSends()
	core := d.probeCore()
	start := time.Now()
	if pb, ok := d.be.(backend.Preemptible); ok && fp.Preemptible {
		err = pb.ForwardPreemptible(d.batch, &d.out)
	} else {
		err = d.be.Forward(d.batch, &d.out)
	}
	took := time.Since(start)
	if ip := d.e.cfg.IdlePoll; ip != nil {
		ip.Extend()
	}
	d.e.schedMu.Lock()
	d.stats.Busy += took
	if core > 0 {
		d.stats.CoreGBps = core
	}
	return took, err
}

// probeCore probes the core's speed when the last good probe is coreEvery
// old (0 otherwise, or where the probe fails: the next forward tries
// again). It runs on the goroutine, so on the thread, that is about to
// run the forward: with one thread a forward, the forward's core; with
// more, the calling thread's.
func (d *driver) probeCore() float64 {
	now := time.Now()
	if now.Sub(d.coreAt) < coreEvery {
		return 0
	}
	g := hoststat.CopySpeed(d.coreA, d.coreB)
	if g > 0 {
		d.coreAt = now
	}
	return g
}

// fill adds planned rows [p.From, p.From+p.N) of p.Item to the batch.
func (d *driver) fill(p sched.Planned) error {
	info := d.e.info
	h := info.Hidden
	w := p.Item.Owner.(*work)
	for r := p.From; r < p.From+p.N; r++ {
		pos := w.First + r
		out := info.LogitsOut && w.RowWantsOutput(r)
		var err error
		switch {
		case info.TokensIn:
			err = d.batch.AddToken(w.Seq, pos, w.tokenIDs[r], out)
		case w.hiddenF:
			err = d.batch.AddHiddenF32(w.Seq, pos, f32s(w.hiddenB[4*r*h:4*(r+1)*h]), out)
		default:
			err = d.batch.AddHiddenBF16(w.Seq, pos, w.hiddenB[2*r*h:2*(r+1)*h], out)
		}
		if err != nil {
			return err // inputs were validated and plan keeps to MaxBatch: a bug
		}
	}
	return nil
}

// apply carries out the recorded effects: prefix saves, then trims (a
// trimmed cell must be gone before any peer learns its work ended), then
// prefix loads, then replies in the order they were decided, then the
// queue count of the items they ended (so Drain sees an empty queue only
// once every reply is handed over), and last the items go back to their
// pool. Deliveries never block (stream.deliver).
func (d *driver) apply() {
	fx := d.s.Effects()
	for _, sv := range fx.Saves {
		d.save(sv)
	}
	for _, t := range fx.Trims {
		d.be.SeqTrim(t.Seq, t.Pos)
	}
	for _, l := range fx.Loads {
		d.load(l)
	}
	for _, r := range fx.Replies {
		w := r.Item.Owner.(*work)
		rp := replyFor(w, r)
		if rp.res != nil {
			rp.gate = d.gate
			d.gate.add()
		}
		w.st.deliver(rp, true)
	}
	if n := len(fx.Retired); n > 0 {
		d.e.queued.Add(-int32(n))
	}
	for _, it := range fx.Retired {
		it.Owner.(*work).recycle()
	}
	fx.Reset()
}

// replyFor is the stream's reply to w for what the scheduler decided.
func replyFor(w *work, r sched.Reply) reply {
	switch {
	case r.Quiet:
		return reply{} // accounting only; nobody reads
	case r.Out != nil:
		return reply{res: r.Out.(*result), duplicate: r.Duplicate}
	case r.Duplicate:
		return reply{ack: &shardv1.Ack{
			WorkId: strings.Clone(w.WorkID), IdempotencyStep: w.Step, Duplicate: true,
			CacheResult: &shardv1.CacheResult{Mode: cacheMode(w.Mode), PastLen: r.PastLen, CacheHit: true},
		}}
	}
	st := statusFor(w.Session, w.WorkID, w.Step, r.Err)
	if errors.Is(r.Err, ErrCacheMiss) {
		st.Error.ActualPastLen = r.ActualPastLen
	}
	return reply{status: st}
}

// save makes a prefix cache entry from a sequence's state.
func (d *driver) save(sv sched.Save) {
	ss, ok := d.be.(backend.SeqStater)
	block := d.s.PrefixBlock()
	if !ok || block == 0 {
		return
	}
	state, err := ss.SeqSave(d.saved[:0], sv.Seq)
	d.saved = state[:0]
	if err != nil {
		d.e.log.Warn("prefix cache: could not save a sequence", "err", err)
		return
	}
	// Only the blocks whose cells the sequence holds, each in position
	// order, are a lone run's bits: a chain may have been fed rows that
	// never ran (a chunk preempted, then cancelled), and in a shared KV
	// buffer a session's later positions can land in earlier cells.
	blocks := min(sv.Blocks, ss.SeqInOrder(state)/block)
	if blocks == 0 {
		d.s.SavePrefix(sv, 0, nil)
		return
	}
	// The entry holds its blocks' cells and no more, so a load trims none
	// and leaves no hole for a later row to land in before them.
	cut, err := ss.SeqCut(d.cut[:0], state, blocks*block)
	d.cut = cut[:0]
	if err != nil {
		d.e.log.Warn("prefix cache: could not cut a sequence's state", "err", err)
		return
	}
	// A copy of its own size: the cache counts its entries' bytes.
	d.s.SavePrefix(sv, blocks, bytes.Clone(cut))
}

// load puts a prefix cache entry's state into a sequence in place of its
// cells. When it does not fit, the sequence gets its own cells back and
// the scheduler runs the rows itself (Undo).
func (d *driver) load(l sched.Load) {
	ss := d.be.(backend.SeqStater) // the scheduler loads only through one
	var err error
	d.backup = d.backup[:0]
	if l.First > 0 {
		if d.backup, err = ss.SeqSave(d.backup, l.Seq); err != nil {
			l.Undo()
			return
		}
	}
	d.be.SeqTrim(l.Seq, 0)
	if err = ss.SeqLoad(l.Seq, l.State); err == nil {
		err = d.be.SeqTrim(l.Seq, l.To)
	}
	if err == nil {
		return
	}
	d.be.SeqTrim(l.Seq, 0)
	if l.First > 0 {
		if err := ss.SeqLoad(l.Seq, d.backup); err != nil {
			d.e.log.Error("prefix cache: could not restore a sequence", "err", err)
		}
	}
	l.Undo()
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
	d.s.Stats(&d.stats)
	d.e.published.set(&d.stats)
}

// shutdown answers everything still queued with CANCELLED, frees the
// state's results and the batch.
func (d *driver) shutdown() {
	d.s.Shutdown()
	d.publish(0)
	d.apply()
	if d.batch != nil {
		d.be.FreeBatch(d.batch)
		d.batch = nil
	}
}
