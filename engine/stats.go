package engine

import (
	"sync"

	"github.com/meshnet/shardd/engine/sched"
)

// Stats are the scheduler's figures, what Health and the metrics report
// (sched.Stats).
type Stats = sched.Stats

// published is the last Stats the driver published.
type published struct {
	mu sync.Mutex
	v  Stats
}

func (p *published) set(st *Stats) {
	p.mu.Lock()
	p.v = *st
	p.mu.Unlock()
}

// Stats returns the scheduler's figures as of its last iteration.
func (e *Engine) Stats() Stats {
	e.published.mu.Lock()
	defer e.published.mu.Unlock()
	return e.published.v
}
