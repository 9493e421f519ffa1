// A prompt's chunks through the hops as a pipeline: while hop i+1 runs
// chunk c, hop i runs chunk c+1.

package route

import (
	"errors"
	"sync"
	"sync/atomic"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// prefillPiped feeds the prompt's units (its chunks, in order, from
// position 0) through the hops as a pipeline: a goroutine a hop, each
// sending its hop one chunk after another as the hop before returns them.
// It returns the last hop's output of the last chunk.
//
// Only one stage runs the generation's code at a time (g.mu): a stage lets
// go of it while it waits on its stream (yield), so the hops compute at
// once while the head's state sees one writer. A stage does not fail its
// hop over: the first error stops the pipeline, and a hop that is gone is
// then replaced and every hop starts again from position 0 (failover,
// errCacheMiss), as a full re-prefill does.
func (g *gen) prefillPiped(units []*unit) ([]*shardv1.NamedTensor, error) {
	g.forget() // a prefill from position 0: history starts again
	hops := len(g.streams)
	feeds := make([]chan *unit, hops+1)
	for i := range feeds {
		feeds[i] = make(chan *unit, len(units)) // a stage never blocks on the next
	}
	for _, u := range units {
		feeds[0] <- u
	}
	close(feeds[0])
	errs := make([]error, hops)
	var stop atomic.Bool
	var wg sync.WaitGroup
	g.piped = true
	for i := range hops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(feeds[i+1])
			errs[i] = g.stage(i, feeds[i], feeds[i+1], &stop)
		}()
	}
	wg.Wait()
	g.piped = false
	for i, err := range errs {
		if err == nil {
			continue
		}
		if down := (*HopDownError)(nil); errors.As(err, &down) {
			return nil, g.failover(i, err)
		}
		return nil, err
	}
	var out []*shardv1.NamedTensor
	for u := range feeds[hops] {
		g.remember(u)
		out = u.out
	}
	return out, nil
}

// stage runs hop i of a pipelined prefill: each unit from in goes to the
// hop, and on to out with the hop's output as the next hop's input (a
// copy: the stream reuses its receive buffers at its next exchange). After
// any stage's error (stop) the units left are passed over.
func (g *gen) stage(i int, in <-chan *unit, out chan<- *unit, stop *atomic.Bool) error {
	last := i == len(g.streams)-1
	for u := range in {
		if stop.Load() {
			continue
		}
		g.mu.Lock()
		res, err := g.call(i, g.request(i, u))
		if err == nil {
			err = g.took(i, u, res)
		}
		if err == nil {
			if last {
				u.out = res // valid until the stream's next exchange, after the pipeline
			} else {
				u.in[i+1] = cloneTensor(res[0])
			}
		}
		g.mu.Unlock()
		if err != nil {
			stop.Store(true)
			return err
		}
		out <- u
	}
	return nil
}

// yield lets another stage of a pipelined prefill run the generation's
// code while this one waits on its stream; resume takes it back.
func (g *gen) yield() {
	if g.piped {
		g.mu.Unlock()
	}
}

func (g *gen) resume() {
	if g.piped {
		g.mu.Lock()
	}
}
