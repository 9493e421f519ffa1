// Package gate holds a flow of bytes until a time: the stalls of the
// relay (shardd relay --stall-every) and of the test fault proxy.
package gate

import (
	"sync/atomic"
	"time"
)

// Gate is closed until a time; the zero Gate is open.
type Gate struct{ until atomic.Int64 }

// Pause closes the gate until until (Unix nanoseconds), or keeps it
// closed until then if it was to open sooner; a later pause never
// shortens an earlier one.
func (g *Gate) Pause(until int64) {
	for {
		old := g.until.Load()
		if old >= until || g.until.CompareAndSwap(old, until) {
			return
		}
	}
}

// Wait sleeps while the gate is closed (it may be extended meanwhile).
func (g *Gate) Wait() {
	for {
		d := time.Duration(g.until.Load() - time.Now().UnixNano())
		if d <= 0 {
			return
		}
		time.Sleep(d)
	}
}
