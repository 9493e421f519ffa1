package relay

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// pair is one head and worker joined.
type pair struct {
	head, worker net.Conn
	once         sync.Once
	ended        atomic.Int32 // directions that ended cleanly
	resetAfter   atomic.Int64 // bytes toward the head before a reset (0: none armed)
}

// close ends both sides; with reset, as an RST (no FIN).
func (p *pair) close(reset bool) {
	p.once.Do(func() {
		for _, c := range []net.Conn{p.head, p.worker} {
			if l, ok := c.(interface{ SetLinger(int) error }); ok && reset {
				l.SetLinger(0)
			}
			c.Close()
		}
	})
}

// addPair registers a head and a worker joined; false (both closed) when
// the relay is closing.
func (r *Relay) addPair(head, worker net.Conn) (*pair, bool) {
	p := &pair{head: head, worker: worker}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		p.close(false)
		return nil, false
	}
	r.pairs[p] = struct{}{}
	return p, true
}

func (r *Relay) dropPair(p *pair) {
	r.mu.Lock()
	delete(r.pairs, p)
	r.mu.Unlock()
}

// pipe copies both ways until both directions end or either fails.
func (r *Relay) pipe(p *pair) {
	done := make(chan struct{}, 2)
	go func() { r.copy(p, p.worker, p.head, &r.stats.toWorker, nil); done <- struct{}{} }()
	r.copy(p, p.head, p.worker, &r.stats.toHead, &p.resetAfter)
	<-done
	p.close(false)
	r.dropPair(p)
}

// chunk is bytes read from one side, due at the other at a time.
type chunk struct {
	b   []byte
	due time.Time
}

// copy forwards src to dst: a reader goroutine timestamps what it reads, and
// this goroutine writes each chunk once its latency has passed and no
// stall holds it. A clean end of src is passed on as a half close.
func (r *Relay) copy(p *pair, dst, src net.Conn, count, resetAfter *atomic.Int64) {
	q := make(chan chunk, 64)
	free := make(chan []byte, 64)
	go func() {
		defer close(q)
		for {
			var b []byte
			select {
			case b = <-free:
			default:
				b = make([]byte, 32<<10)
			}
			n, err := src.Read(b[:cap(b)])
			if n > 0 {
				q <- chunk{b: b[:n], due: time.Now().Add(r.Latency)}
			}
			if err != nil {
				if err == io.EOF {
					q <- chunk{} // clean end
				} else {
					p.close(true) // a reset is passed on as a reset
				}
				return
			}
		}
	}()
	failed := false
	for ch := range q {
		if failed {
			continue
		}
		if ch.b == nil {
			if hc, ok := dst.(interface{ CloseWrite() error }); ok {
				hc.CloseWrite()
			}
			if p.ended.Add(1) == 2 {
				p.close(false)
			}
			continue
		}
		if d := time.Until(ch.due); d > 0 {
			time.Sleep(d)
		}
		r.stall.Wait()
		b, cut := ch.b, false
		if resetAfter != nil {
			if left := resetAfter.Load(); left > 0 {
				if int64(len(b)) >= left {
					b, cut = b[:left], true
				} else {
					resetAfter.Add(-int64(len(b)))
				}
			}
		}
		n, err := dst.Write(b)
		count.Add(int64(n))
		if err != nil || cut {
			failed = true
			if cut {
				r.stats.resets.Add(1)
			}
			p.close(cut)
		}
		select {
		case free <- ch.b[:0]:
		default:
		}
	}
}
