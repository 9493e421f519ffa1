package engine

// effects are what a change of the scheduler's state asks of the world:
// replies to deliver to streams and sequences to trim in the backend. The
// scheduler records them as it decides; its driver carries them out
// (driver.apply) before it runs the next forward, so deciding never
// waits on I/O and a scripted test can read them instead. The slices are
// reused: recording allocates nothing once they have grown.
type effects struct {
	trims      []trimOp
	deliveries []delivery
	// retired are the submitted items answered, which leave the engine's
	// queue count (Engine.queued) once their replies are out, and then go
	// back to their pool.
	retired []*work
	// saves and loads are the prefix cache's copies of KV state
	// (prefix.go): saves run first, while the sequence still holds what
	// was saved for; loads after the trims, before the next forward.
	saves []saveOp
	loads []loadOp
}

// saveOp makes a prefix cache entry of the first blocks of chain from
// sequence seq's state.
type saveOp struct {
	seq    int
	chain  *prefixChain
	blocks int
}

// loadOp replaces sequence seq's cells by state, trimmed to positions
// [0, to); first is where the sequence stood (its cells are restored if
// the load fails, and undo tells the scheduler).
type loadOp struct {
	seq, first, to int
	state          []byte
	undo           func()
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
	clear(f.retired)
	clear(f.saves)
	clear(f.loads)
	f.trims, f.deliveries, f.retired = f.trims[:0], f.deliveries[:0], f.retired[:0]
	f.saves, f.loads = f.saves[:0], f.loads[:0]
}
