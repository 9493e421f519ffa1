// Package relay joins a head and a worker that cannot reach each other
// directly: both dial out to a relay, which pairs their connections and
// copies bytes between them without parsing any. The frames carried are the
// contract's messages (package frames); the relay never decodes one, so
// deadlines, identity, flow control and errors travel in-band, end to end,
// and TLS between head and worker (when configured) passes through it.
//
// Rendezvous. Each side opens a TCP connection to the relay and sends one
// text line; then the relay answers one line and, once paired, the
// connection is a plain byte pipe:
//
//	worker:  "SHARDD-RELAY/1 SERVE <name>\n"  -> waits -> "PAIRED\n"
//	head:    "SHARDD-RELAY/1 DIAL <name>\n"   -> "OK\n" | "ERR <reason>\n"
//
// A worker keeps a few idle SERVE connections registered (Listen); each DIAL
// takes one, and the worker registers another. A DIAL waits a bounded time
// for a registration, so a worker that is restarting is found when it comes
// back.
//
// For tests and demos a Relay adds latency to every chunk it forwards,
// stalls on a schedule, and can cut every paired connection at once; it
// counts the bytes it carried each way.
package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnet/shardd/internal/gate"
)

const (
	version = "SHARDD-RELAY/1"
	// maxLine bounds a rendezvous line.
	maxLine = 256
	// maxName bounds a worker's name.
	maxName = 128
)

// Errors a caller can classify.
var (
	ErrRefused = errors.New("relay: refused")
	ErrURL     = errors.New("relay: not a relay://HOST:PORT/NAME address")
)

// ParseURL splits "relay://HOST:PORT/NAME" into the relay's address and
// the worker's name.
func ParseURL(s string) (addr, name string, err error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "relay" || u.Host == "" || u.User != nil || u.RawQuery != "" {
		return "", "", fmt.Errorf("%w: %q", ErrURL, s)
	}
	name = strings.TrimPrefix(u.Path, "/")
	if err := checkName(name); err != nil {
		return "", "", fmt.Errorf("%w: %q: %v", ErrURL, s, err)
	}
	return u.Host, name, nil
}

func checkName(name string) error {
	if name == "" || len(name) > maxName {
		return fmt.Errorf("a name of 1..%d characters", maxName)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("name %q: letters, digits, '-', '_' and '.' only", name)
		}
	}
	return nil
}

// readLine reads one rendezvous line byte by byte, so that nothing after
// it is consumed.
func readLine(c net.Conn) (string, error) {
	var b [1]byte
	var line []byte
	for len(line) <= maxLine {
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return "", err
		}
		if b[0] == '\n' {
			return string(line), nil
		}
		line = append(line, b[0])
	}
	return "", fmt.Errorf("%w: rendezvous line too long", ErrRefused)
}

// Dial opens a connection to the worker registered as name at the relay
// addr. The connection is the byte pipe to the worker once Dial returns.
func Dial(ctx context.Context, addr, name string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	line, err := func() (string, error) {
		if _, err := fmt.Fprintf(c, "%s DIAL %s\n", version, name); err != nil {
			return "", err
		}
		return readLine(c)
	}()
	if !stop() || ctx.Err() != nil {
		c.Close()
		return nil, ctx.Err()
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("relay %s: %w", addr, err)
	}
	if line != "OK" {
		c.Close()
		return nil, fmt.Errorf("%w: relay %s: %s", ErrRefused, addr, strings.TrimPrefix(line, "ERR "))
	}
	return c, nil
}

// Relay pairs workers' and heads' connections and copies bytes between
// them. Set the fields before Serve.
type Relay struct {
	// Latency is added to every chunk of bytes in each direction.
	Latency time.Duration
	// StallEvery and StallFor stop all forwarding for StallFor once every
	// StallEvery (0: never).
	StallEvery, StallFor time.Duration
	// WaitTimeout bounds how long a DIAL waits for its worker to register
	// (default 10 s).
	WaitTimeout time.Duration
	// MaxIdle bounds the idle registrations of one name (default 64).
	MaxIdle int
	// MaxConns bounds the open connections, paired, idle or saying who
	// they are (default 4096); one more is closed at once.
	MaxConns int
	Log      *slog.Logger

	mu     sync.Mutex // guards the fields below
	idle   map[string]*nameQueue
	pairs  map[*pair]struct{}
	lns    map[net.Listener]struct{}
	closed bool

	stall gate.Gate
	wg    sync.WaitGroup
	done  chan struct{}
	once  sync.Once

	conns atomic.Int64 // open connections (countedConn)

	stats struct {
		paired, refused, resets atomic.Int64
		toWorker, toHead        atomic.Int64
	}
}

// Stats counts what a relay did.
type Stats struct {
	Paired, Refused, Resets int64
	// BytesToWorker and BytesToHead are the bytes written to each side
	// after pairing: exactly what the other side sent.
	BytesToWorker, BytesToHead int64
}

// Stats returns the counters so far.
func (r *Relay) Stats() Stats {
	return Stats{
		Paired: r.stats.paired.Load(), Refused: r.stats.refused.Load(), Resets: r.stats.resets.Load(),
		BytesToWorker: r.stats.toWorker.Load(), BytesToHead: r.stats.toHead.Load(),
	}
}

func (r *Relay) init() {
	r.once.Do(func() {
		// Under mu too: a reader that holds mu but has not called init
		// (the tests' probes) is ordered after these writes.
		r.mu.Lock()
		r.idle, r.pairs, r.lns = map[string]*nameQueue{}, map[*pair]struct{}{}, map[net.Listener]struct{}{}
		r.mu.Unlock()
		r.done = make(chan struct{})
		if r.WaitTimeout == 0 {
			r.WaitTimeout = 10 * time.Second
		}
		if r.MaxIdle == 0 {
			r.MaxIdle = 64
		}
		if r.MaxConns == 0 {
			r.MaxConns = 4096
		}
		if r.Log == nil {
			r.Log = slog.New(slog.DiscardHandler)
		}
		if r.StallEvery > 0 && r.StallFor > 0 {
			r.wg.Add(1)
			go r.stalls()
		}
	})
}

// Serve accepts connections on ln until ln or the relay is closed.
func (r *Relay) Serve(ln net.Listener) error {
	r.init()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		ln.Close()
		return net.ErrClosed
	}
	r.lns[ln] = struct{}{}
	r.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		if r.conns.Add(1) > int64(r.MaxConns) {
			r.conns.Add(-1)
			r.stats.refused.Add(1)
			c.Close()
			continue
		}
		// Added under the lock, after checking closed: a WaitGroup's Add
		// must not race with Close's Wait.
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			r.conns.Add(-1)
			c.Close()
			return net.ErrClosed
		}
		r.wg.Add(1)
		r.mu.Unlock()
		go r.handle(&countedConn{Conn: c, n: &r.conns})
	}
}

// countedConn counts itself out of the relay's open connections when it
// is first closed.
type countedConn struct {
	net.Conn
	n    *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.n.Add(-1) })
	return c.Conn.Close()
}

// CloseWrite passes a half close on (the pipe forwards a clean end so).
func (c *countedConn) CloseWrite() error {
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		return tc.CloseWrite()
	}
	return nil
}

// SetLinger is the TCP option, for a reset.
func (c *countedConn) SetLinger(sec int) error {
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		return tc.SetLinger(sec)
	}
	return nil
}

// Close stops accepting, closes every connection and waits for the
// relay's goroutines.
func (r *Relay) Close() {
	r.init()
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.done)
	}
	for ln := range r.lns {
		ln.Close()
	}
	for p := range r.pairs {
		p.close(false)
	}
	for _, q := range r.idle {
		for _, w := range q.waiters {
			w.c.Close()
		}
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// Reset cuts every paired connection (both sides see a reset), as a relay
// that restarts or loses its network would. It returns how many.
func (r *Relay) Reset() int {
	r.mu.Lock()
	ps := make([]*pair, 0, len(r.pairs))
	for p := range r.pairs {
		ps = append(ps, p)
	}
	r.mu.Unlock()
	for _, p := range ps {
		p.close(true)
	}
	r.stats.resets.Add(int64(len(ps)))
	return len(ps)
}

// ResetAfter arms every paired connection to be reset once n more bytes
// have gone toward the head: with n smaller than a response, the reset
// lands in the middle of it, after the worker has done the work. It
// returns how many connections were armed.
func (r *Relay) ResetAfter(n int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for p := range r.pairs {
		p.resetAfter.Store(max(n, 1))
	}
	return len(r.pairs)
}

// Stall stops all forwarding for d.
func (r *Relay) Stall(d time.Duration) { r.stall.Pause(time.Now().Add(d).UnixNano()) }

func (r *Relay) stalls() {
	defer r.wg.Done()
	t := time.NewTicker(r.StallEvery)
	defer t.Stop()
	for {
		select {
		case <-r.done:
			return
		case <-t.C:
			r.Stall(r.StallFor)
		}
	}
}

// handle reads a connection's rendezvous line and registers or pairs it.
func (r *Relay) handle(c net.Conn) {
	defer r.wg.Done()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := readLine(c)
	c.SetReadDeadline(time.Time{})
	f := strings.Fields(line)
	if err == nil && (len(f) != 3 || f[0] != version || (f[1] != "SERVE" && f[1] != "DIAL")) {
		err = fmt.Errorf("%w: not a %s rendezvous", ErrRefused, version)
	}
	if err == nil {
		err = checkName(f[2])
	}
	if err != nil {
		r.refuse(c, "bad rendezvous line")
		return
	}
	if f[1] == "SERVE" {
		r.register(c, f[2])
		return
	}
	r.pairDial(c, f[2])
}

func (r *Relay) refuse(c net.Conn, why string) {
	r.stats.refused.Add(1)
	c.SetWriteDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(c, "ERR %s\n", why)
	c.Close()
}

// waiter is a worker's idle registration.
type waiter struct {
	c    net.Conn
	name string
	// watched is closed when the watch goroutine returns: the worker's
	// side closed (or sent bytes before being paired), or pairing
	// interrupted the watch.
	watched chan struct{}
}

// nameQueue holds one name's idle registrations, oldest first.
type nameQueue struct {
	waiters []*waiter
	// arrived is closed (and replaced) when a registration arrives.
	arrived chan struct{}
}

// queueLocked returns name's queue, made on first use; nil when the relay
// holds too many names. r.mu must be held.
func (r *Relay) queueLocked(name string) *nameQueue {
	q, ok := r.idle[name]
	if !ok {
		if len(r.idle) >= 4096 {
			return nil
		}
		q = &nameQueue{arrived: make(chan struct{})}
		r.idle[name] = q
	}
	return q
}

// unqueueLocked removes w from its name's queue. It reports whether w was
// there. r.mu must be held.
func (r *Relay) unqueueLocked(w *waiter) bool {
	q := r.idle[w.name]
	if q == nil {
		return false
	}
	for i, x := range q.waiters {
		if x == w {
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			return true
		}
	}
	return false
}

// register parks a worker's connection until a head dials its name.
func (r *Relay) register(c net.Conn, name string) {
	w := &waiter{c: c, name: name, watched: make(chan struct{})}
	r.mu.Lock()
	q := r.queueLocked(name)
	switch {
	case r.closed:
		r.mu.Unlock()
		c.Close()
		return
	case q == nil:
		r.mu.Unlock()
		r.refuse(c, "relay full")
		return
	case len(q.waiters) >= r.MaxIdle:
		r.mu.Unlock()
		r.refuse(c, "too many idle registrations")
		return
	}
	q.waiters = append(q.waiters, w)
	close(q.arrived)
	q.arrived = make(chan struct{})
	r.mu.Unlock()
	// Watch the idle connection, so that a worker that went away leaves
	// the queue at once: a read returns only when it closes (or
	// misbehaves), or when pairing interrupts it with a past deadline.
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(w.watched)
		var b [1]byte
		_, err := c.Read(b[:])
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return // pairing took it
		}
		r.mu.Lock()
		r.unqueueLocked(w)
		r.mu.Unlock()
		c.Close()
	}()
}

// take removes and returns name's oldest idle registration, or the
// channel that is closed when the next one arrives.
func (r *Relay) take(name string) (*waiter, <-chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.queueLocked(name)
	if q == nil || r.closed {
		return nil, nil, false
	}
	if len(q.waiters) > 0 {
		w := q.waiters[0]
		q.waiters = q.waiters[1:]
		return w, nil, true
	}
	return nil, q.arrived, true
}

// pairDial pairs a head's connection with an idle registration of name.
func (r *Relay) pairDial(c net.Conn, name string) {
	timeout := time.NewTimer(r.WaitTimeout)
	defer timeout.Stop()
	for {
		w, arrived, ok := r.take(name)
		if !ok {
			r.refuse(c, "relay full")
			return
		}
		if w == nil {
			select {
			case <-arrived:
				continue
			case <-timeout.C:
				r.refuse(c, "no worker registered as "+name)
				return
			case <-r.done:
				c.Close()
				return
			}
		}
		// Stop the watch. A registration whose worker left in the
		// meantime was closed by its watch: try the next.
		w.c.SetReadDeadline(time.Now())
		<-w.watched
		w.c.SetReadDeadline(time.Time{})
		// The pair is known (to Reset, ResetAfter and Close) before
		// either side hears of it.
		p, ok := r.addPair(c, w.c)
		if !ok {
			return
		}
		if _, err := io.WriteString(w.c, "PAIRED\n"); err != nil {
			r.dropPair(p)
			w.c.Close()
			continue
		}
		if _, err := io.WriteString(c, "OK\n"); err != nil {
			r.dropPair(p)
			p.close(false)
			return
		}
		r.stats.paired.Add(1)
		r.pipe(p)
		return
	}
}
