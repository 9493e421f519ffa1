// Package idlepoll keeps a worker's CPUs from going idle between forwards.
//
// On a virtual machine a vCPU with nothing to run halts, and the host
// gives its physical CPU to another guest; the next wakeup (a peer's
// activations arriving) then waits for the host to run the vCPU again.
// The guest sees that wait as steal time. A hop of a pipelined route idles
// between its forwards many times a second (waiting for the other hop),
// so it pays that wait at every one, where a whole model kept busy does
// not: on this project's Intel VM, a 2-hop route's CPUs read 5-31% steal in
// busy seconds, the whole model's busy CPU about 0 (PERF.md, noise).
//
// A Poller runs one thread per CPU, pinned there at SCHED_IDLE: it spins
// for a window after each Extend, so the vCPU never halts while a burst of
// forwards goes on, and any runnable thread of normal priority (the
// forward, the worker's network goroutines) takes the CPU from it at once.
// After the window it sleeps until the next Extend. Guest kernels with the
// haltpoll cpuidle driver do this themselves; these hosts run none. It
// cuts the steal (610 -> 325 ticks in adjacent runs); what that buys in
// tokens/s depends on how busy the host is, and was within its drift when
// measured (PERF.md, noise).
package idlepoll

/*
#cgo CFLAGS: -O2
#include "idlepoll.h"
*/
import "C"

import (
	"fmt"
	"syscall"
	"time"
)

// Poller is one spinning thread per CPU it was started on.
type Poller struct {
	window  time.Duration
	threads []*C.shardd_idlepoll
}

// Start starts a thread on each of cpus that spins for window after each
// Extend. It fails, starting none, where a thread cannot be pinned to a
// CPU or run at SCHED_IDLE.
func Start(cpus []int, window time.Duration) (*Poller, error) {
	if len(cpus) == 0 || window <= 0 {
		return nil, fmt.Errorf("idlepoll: %d CPUs, window %v", len(cpus), window)
	}
	p := &Poller{window: window}
	for _, cpu := range cpus {
		var e C.int
		t := C.shardd_idlepoll_start(C.int(cpu), &e)
		if t == nil {
			p.Stop()
			return nil, fmt.Errorf("idlepoll: a thread on CPU %d: %w", cpu, syscall.Errno(e))
		}
		p.threads = append(p.threads, t)
	}
	return p, nil
}

// Extend makes every thread spin for the window from now. A nil Poller
// does nothing.
func (p *Poller) Extend() {
	if p == nil {
		return
	}
	for _, t := range p.threads {
		C.shardd_idlepoll_extend(t, C.int64_t(p.window))
	}
}

// Spun is the CPU time the threads have spun in all (0 for a nil
// Poller).
func (p *Poller) Spun() time.Duration {
	if p == nil {
		return 0
	}
	var ns int64
	for _, t := range p.threads {
		ns += int64(C.shardd_idlepoll_spun(t))
	}
	return time.Duration(ns)
}

// tids are the threads' ids (tests).
func (p *Poller) tids() []int {
	var ids []int
	for _, t := range p.threads {
		ids = append(ids, int(C.shardd_idlepoll_tid(t)))
	}
	return ids
}

// Stop ends the threads; the Poller is not used after.
func (p *Poller) Stop() {
	if p == nil {
		return
	}
	for _, t := range p.threads {
		C.shardd_idlepoll_stop(t)
	}
	p.threads = nil
}
