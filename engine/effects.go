package engine

// effects are what a change of the scheduler's state asks of the world:
// replies to deliver to streams and sequences to trim in the backend. The
// scheduler records them as it decides; its driver carries them out
// (scheduler.apply) before it runs the next forward, so deciding never
// waits on I/O and a scripted test can read them instead. The slices are
// reused: recording allocates nothing once they have grown.
type effects struct {
	trims      []trimOp
	deliveries []delivery
}

// trimOp removes a backend sequence's cells from pos on.
type trimOp struct{ seq, pos int }

// delivery is a reply for a stream; work is true when it answers a unit
// of work (releasing its credit).
type delivery struct {
	st   *stream
	r    reply
	work bool
}

func (f *effects) trim(seq, pos int) { f.trims = append(f.trims, trimOp{seq, pos}) }

func (f *effects) deliver(st *stream, r reply, work bool) {
	f.deliveries = append(f.deliveries, delivery{st, r, work})
}

// reset forgets carried-out effects, keeping the slices.
func (f *effects) reset() {
	clear(f.deliveries) // drop the replies' references to results
	f.trims, f.deliveries = f.trims[:0], f.deliveries[:0]
}

// apply carries out the recorded effects: trims first (a trimmed cell
// must be gone before any peer learns its work ended), then deliveries in
// the order they were decided. Deliveries never block (stream.deliver).
func (s *scheduler) apply() {
	for _, t := range s.fx.trims {
		s.e.be.SeqTrim(t.seq, t.pos)
	}
	for _, d := range s.fx.deliveries {
		d.st.deliver(d.r, d.work)
	}
	s.fx.reset()
}
