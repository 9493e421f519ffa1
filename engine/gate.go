package engine

import (
	"runtime"
	"sync/atomic"
	"time"
)

// sendGate counts the results handed to send loops that are still on
// their way to the wire, so the driver can let them out before it starts
// the next forward (driver.awaitSends). One per driver.
//
// Why: a worker pinned to one CPU runs its forward on that CPU, and the
// goroutines that frame and send the last forward's results (a stream's
// send loop, gRPC's writer) run there too. Started first, a forward holds
// the CPU, and the sends wait for the runtime to take back the forward's P
// and the kernel to preempt it: on a busy hop the last of a group's 16
// results left 1.6-2.0 ms after its forward on average (p90 4.0-4.7 ms),
// against 0.5 ms where no forward followed; the next hop and the head wait
// for the last one. Sending first costs the CPU nothing (the same work in
// another order) and takes the crossing off the pipeline's critical path.
type sendGate struct {
	// left counts the replies handed to send loops and not yet released
	// (sent, or dropped with their stream); done gets a token when it
	// reaches 0.
	left atomic.Int32
	done chan struct{}
}

func newSendGate() *sendGate { return &sendGate{done: make(chan struct{}, 1)} }

// add counts one more reply under the gate.
func (g *sendGate) add() { g.left.Add(1) }

// release marks one reply sent or dropped.
func (g *sendGate) release() {
	if g.left.Add(-1) == 0 {
		select {
		case g.done <- struct{}{}:
		default:
		}
	}
}

// sendWait bounds how long a forward waits for the last forward's results
// to leave: long enough for a group of small results (16 sessions' decode
// steps took 0.3-0.7 ms), short enough that a peer that stops reading (a
// send blocked on HTTP/2 flow control) costs a forward little.
const sendWait = 2 * time.Millisecond

// awaitSends waits, up to sendWait, until every counted reply has been sent,
// then yields once so gRPC's writer goroutine can put them on the socket
// (the spans time Send's return, not the write). A wait that runs out means
// a peer is slow to read (its send blocked on flow control): forwards then
// stop waiting, so the others' sessions do not pay sendWait on every
// forward, until a check finds every reply counted since sent or dropped
// (the stream cut off). Called without schedMu held.
func (d *driver) awaitSends() {
	g := d.gate
	if g.left.Load() == 0 {
		d.sendStuck = false
		return
	}
	if d.sendStuck {
		return
	}
	start := time.Now()
	d.stats.SendWaits++
	defer func() { d.stats.SendWaited += time.Since(start) }()
	if d.sendTimer == nil {
		d.sendTimer = time.NewTimer(sendWait)
	} else {
		d.sendTimer.Reset(sendWait)
	}
	defer d.sendTimer.Stop()
	for g.left.Load() > 0 {
		select {
		case <-g.done: // may be a stale token: the loop checks again
		case <-d.sendTimer.C:
			d.sendStuck = true
			d.stats.SendWaitsExpired++
			return
		}
	}
	runtime.Gosched()
}
