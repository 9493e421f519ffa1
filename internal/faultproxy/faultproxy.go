// Package faultproxy is a TCP proxy that injects the faults a soak needs
// into live connections: a reset part way through a message, a stall of
// both directions, and a peer that stops reading. Tests only, on loopback.
//
// Faults apply to the connections open when they are injected; a new
// connection starts clean. (toxiproxy, which the load harness uses for
// latency and bandwidth, wedges a link when a toxic is added while
// connections are live; see load/links.go.)
package faultproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnet/shardd/internal/gate"
)

// Proxy forwards every connection accepted on Addr to a target address.
type Proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	links map[*link]struct{}
	wg    sync.WaitGroup

	accepted, resets atomic.Int64
}

// Stats counts what the proxy did.
type Stats struct {
	Accepted int64 // connections accepted
	Resets   int64 // connections reset by a fault
}

// New listens on a free loopback port and forwards to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address to dial instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	return Stats{Accepted: p.accepted.Load(), Resets: p.resets.Load()}
}

// Close stops accepting, resets every live connection and waits for the
// forwarding goroutines to end.
func (p *Proxy) Close() {
	p.ln.Close()
	for _, l := range p.live() {
		l.reset()
	}
	p.wg.Wait()
}

// ResetAfter arms every live connection to be reset (RST both ways) once n
// more bytes have gone from the client to the target: with n smaller than
// a message, the reset lands in the middle of it. It returns how many
// connections were armed.
func (p *Proxy) ResetAfter(n int64) int {
	ls := p.live()
	for _, l := range ls {
		l.resetAfter.Store(max(n, 1))
	}
	return len(ls)
}

// Stall stops forwarding in both directions on every live connection for
// d; bytes wait in the kernel's buffers and flow on afterwards.
func (p *Proxy) Stall(d time.Duration) int {
	ls := p.live()
	until := time.Now().Add(d).UnixNano()
	for _, l := range ls {
		l.toServer.Pause(until)
		l.toClient.Pause(until)
	}
	return len(ls)
}

// StopReading makes the proxy stop reading what the target sends, on every
// live connection, for d: to the target the client is a peer that stopped
// reading, so its writes back up once the socket buffers fill. Forwarding
// toward the target goes on.
func (p *Proxy) StopReading(d time.Duration) int {
	ls := p.live()
	until := time.Now().Add(d).UnixNano()
	for _, l := range ls {
		l.toClient.Pause(until)
	}
	return len(ls)
}

func (p *Proxy) live() []*link {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*link, 0, len(p.links))
	for l := range p.links {
		out = append(out, l)
	}
	return out
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.accepted.Add(1)
		l := &link{p: p, client: c.(*net.TCPConn), server: s.(*net.TCPConn)}
		p.mu.Lock()
		p.links[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go l.pump(l.server, l.client, &l.toServer, true)
		go l.pump(l.client, l.server, &l.toClient, false)
	}
}

// link is one proxied connection.
type link struct {
	p              *Proxy
	client, server *net.TCPConn

	toServer, toClient gate.Gate
	resetAfter         atomic.Int64 // bytes toward the server before a reset (0: none armed)
	halfClosed         atomic.Int32 // directions that ended with a clean EOF
	once               sync.Once
}

// pump copies src to dst through the gate. A clean end of src is passed
// on as a half close; the link ends when both directions have ended or
// either fails.
func (l *link) pump(dst, src *net.TCPConn, g *gate.Gate, toServer bool) {
	defer l.p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		g.Wait()
		n, err := src.Read(buf)
		if n > 0 {
			g.Wait()
			chunk := buf[:n]
			cut := false
			if toServer {
				if left := l.resetAfter.Load(); left > 0 {
					if int64(n) >= left {
						chunk, cut = chunk[:left], true
					} else {
						l.resetAfter.Add(-int64(n))
					}
				}
			}
			if _, werr := dst.Write(chunk); werr != nil {
				l.end()
				return
			}
			if cut {
				l.reset()
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				dst.CloseWrite()
				if l.halfClosed.Add(1) < 2 {
					return
				}
			}
			l.end()
			return
		}
	}
}

// reset aborts both connections (SO_LINGER 0: the peers see a reset).
func (l *link) reset() {
	l.once.Do(func() {
		l.p.resets.Add(1)
		l.abort()
	})
}

// end closes both connections after a pump stopped.
func (l *link) end() {
	l.once.Do(l.abort)
}

func (l *link) abort() {
	l.client.SetLinger(0)
	l.server.SetLinger(0)
	l.client.Close()
	l.server.Close()
	l.p.mu.Lock()
	delete(l.p.links, l)
	l.p.mu.Unlock()
}
