package engine

import (
	"fmt"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/engine/sched"
	"github.com/meshnet/shardd/kvcache"
)

// positionsAgree checks the invariant that ties the session store to the
// backend: once the effects are carried out, every session's PastLen is the
// positions its backend sequence holds plus the rows of its admitted work
// still to run (admission reserves a chunk's rows before they run). A
// session whose next row would not continue its cells is the desync that
// llama_decode refuses ("position does not continue the sequence"); this
// finds it where it starts instead. Admitted work must also hold the
// store's live session and its sequence: work left holding a dropped
// session would run its rows into a sequence another session now owns,
// which the sum above cannot see. It returns nil where the backend cannot
// count positions.
func (d *driver) positionsAgree() error {
	sc, ok := d.be.(backend.SeqCounter)
	if !ok {
		return nil
	}
	pending := map[*kvcache.Session]int{}
	store := d.s.Store()
	var err error
	d.s.Each(func(w *sched.Item) {
		if !w.Admitted() || w.Sess == nil || w.Mode == sched.Stateless {
			return
		}
		pending[w.Sess] += w.Tokens - w.Done
		if live, ok := store.Peek(w.Session); (!ok || live != w.Sess || w.Seq != live.Seq) && err == nil {
			err = fmt.Errorf("engine: admitted work %q of session %q holds sequence %d of a session the store no longer has", w.WorkID, w.Session, w.Seq)
		}
	})
	if err != nil {
		return err
	}
	store.Each(func(sess *kvcache.Session) {
		want := sess.PastLen - pending[sess]
		if got := sc.SeqNext(sess.Seq); got != want && err == nil {
			err = fmt.Errorf("engine: session %q (sequence %d) is at position %d (past %d, %d rows to run) but its cells end at %d",
				sess.ID, sess.Seq, want, sess.PastLen, pending[sess], got-1)
		}
	})
	return err
}

// checkPositions panics, in builds with -tags invariants (tests, the
// soak), when positionsAgree finds a disagreement.
func (d *driver) checkPositions() {
	if !bufpool.Invariants {
		return
	}
	if err := d.positionsAgree(); err != nil {
		panic(err)
	}
}
