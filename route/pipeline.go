// A prompt's chunks through the hops as a pipeline: while hop i+1 runs
// chunk c, hop i runs chunk c+1.

package route

import (
	"errors"
	"sync"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// prefillPiped feeds the prompt's units (its chunks, in order, from
// position 0) through the hops as a pipeline: a goroutine a hop, each
// sending its hop one chunk after another as the hop before returns them.
// A hop's finished chunks wait for the next hop in a queue of pipeAhead,
// so the copies of hidden states in flight stay bounded whatever the
// prompt's length. It returns the last hop's output of the last chunk.
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
	feeds := make([]chan *unit, hops)
	feeds[0] = make(chan *unit, len(units))
	for _, u := range units {
		feeds[0] <- u
	}
	close(feeds[0])
	for i := 1; i < hops; i++ {
		feeds[i] = make(chan *unit, pipeAhead)
	}
	p := &pipe{errs: make([]error, hops), abort: make(chan struct{})}
	var wg sync.WaitGroup
	g.piped = true
	for i := range hops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out chan<- *unit
			if i < hops-1 {
				out = feeds[i+1]
				defer close(out)
			}
			if err := g.stage(i, feeds[i], out, p); err != nil {
				p.fail(i, err)
			}
		}()
	}
	wg.Wait()
	g.piped = false
	for i, err := range p.errs {
		if err == nil {
			continue
		}
		if down := (*HopDownError)(nil); errors.As(err, &down) {
			return nil, g.failover(i, err)
		}
		return nil, err
	}
	return p.last, nil
}

// pipeAhead is how many chunks a hop of a pipelined prefill may finish
// before the next hop takes the first of them.
const pipeAhead = 2

// pipe is a pipelined prefill's shared state: each stage's error, abort
// closed at the first, and the last hop's output of the last chunk.
type pipe struct {
	errs  []error
	abort chan struct{}
	once  sync.Once
	last  []*shardv1.NamedTensor
}

func (p *pipe) fail(i int, err error) {
	p.errs[i] = err
	p.once.Do(func() { close(p.abort) })
}

// stage runs hop i of a pipelined prefill: each unit from in goes to the
// hop, and on to out with the hop's output as the next hop's input (a
// copy: the stream reuses its receive buffers at its next exchange). The
// last hop (out nil) keeps each unit in the failover history, in order,
// and the output of the last. After any stage's error (p.abort) the
// units left are passed over.
func (g *gen) stage(i int, in <-chan *unit, out chan<- *unit, p *pipe) error {
	for u := range in {
		select {
		case <-p.abort:
			continue
		default:
		}
		g.mu.Lock()
		res, err := g.call(i, g.request(i, u))
		if err == nil {
			err = g.took(i, u, res)
		}
		if err == nil {
			if out == nil {
				g.remember(u)
				p.last = res // valid until the stream's next exchange, after the pipeline
			} else {
				u.in[i+1] = cloneTensor(res[0])
			}
		}
		g.mu.Unlock()
		if err != nil {
			return err
		}
		if out != nil {
			select {
			case out <- u:
			case <-p.abort:
			}
		}
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
