package sched

// Effects are what a change of the scheduler's state asks of the world:
// replies to deliver, backend sequences to trim, KV state to save and load,
// and the items that are done with. The scheduler records them as it
// decides; its driver carries them out before it runs the next forward,
// so deciding never waits on I/O and a scripted test can read them
// instead. The slices are reused: recording allocates nothing once they
// have grown.
type Effects struct {
	// Saves make prefix cache entries; they run first, while the sequence
	// still holds what was saved for.
	Saves []Save
	// Trims remove a sequence's cells; a trimmed cell must be gone before
	// any peer learns its work ended.
	Trims []Trim
	// Loads replace a sequence's cells by a prefix entry's, after the
	// trims and before the next forward.
	Loads []Load
	// Replies, in the order they were decided.
	Replies []Reply
	// Retired are the submitted items answered, which leave the
	// submitter's queue count once their replies are out.
	Retired []*Item
}

// Trim removes a backend sequence's cells from Pos on.
type Trim struct{ Seq, Pos int }

// Save makes a prefix cache entry of the first Blocks blocks of Chain from
// sequence Seq's state (Scheduler.SavePrefix).
type Save struct {
	Seq    int
	Chain  *Chain
	Blocks int
}

// Load replaces sequence Seq's cells by State, trimmed to positions [0,
// To); First is where the sequence stood (its cells are restored if the
// load fails, and Undo tells the scheduler).
type Load struct {
	Seq, First, To int
	State          []byte
	Undo           func()
}

// Reply answers one submitted item, releasing its credit. Exactly one of
// Out, Err, a bare duplicate and Quiet holds.
type Reply struct {
	Item *Item
	// Out is the completed item's output, or with Duplicate the cached one
	// of the step it repeats; the reply holds a reference.
	Out Output
	// Err refuses the item; with a CACHE_MISS, ActualPastLen is what the
	// session holds.
	Err           error
	ActualPastLen uint64
	// Duplicate without Out: a bare duplicate acknowledgement, the
	// session at PastLen.
	Duplicate bool
	PastLen   uint64
	// Quiet: the item's stream is gone; only the accounting remains.
	Quiet bool
}

func (f *Effects) trim(seq, pos int) { f.Trims = append(f.Trims, Trim{seq, pos}) }

func (f *Effects) reply(r Reply) { f.Replies = append(f.Replies, r) }

// Reset forgets carried-out effects, keeping the slices.
func (f *Effects) Reset() {
	clear(f.Replies) // drop the replies' references to outputs
	clear(f.Retired)
	clear(f.Saves)
	clear(f.Loads)
	f.Trims, f.Replies, f.Retired = f.Trims[:0], f.Replies[:0], f.Retired[:0]
	f.Saves, f.Loads = f.Saves[:0], f.Loads[:0]
}
