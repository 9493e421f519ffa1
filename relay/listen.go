package relay

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"
)

// ListenOptions tune a worker's registration.
type ListenOptions struct {
	// Idle is how many registrations are kept waiting at the relay: how
	// many heads can open a connection at the same instant (default 4).
	Idle int
	Log  *slog.Logger
}

// Listener is a worker's side of a relay: a net.Listener whose Accept
// returns the connections heads opened to its name. It keeps Idle
// registrations waiting at the relay, replaces each one that is paired,
// and redials with backoff while the relay is unreachable.
type Listener struct {
	addr, name string
	opts       ListenOptions

	accepted chan net.Conn
	ctx      context.Context
	stop     context.CancelFunc
	wg       sync.WaitGroup

	mu      sync.Mutex // guards pending
	pending map[net.Conn]struct{}
}

// Listen registers with the relay at addr under name.
func Listen(addr, name string, opts ListenOptions) (*Listener, error) {
	if err := checkName(name); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrURL, err)
	}
	if opts.Idle <= 0 {
		opts.Idle = 4
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	l := &Listener{addr: addr, name: name, opts: opts, accepted: make(chan net.Conn), ctx: ctx, stop: stop, pending: map[net.Conn]struct{}{}}
	for range opts.Idle {
		l.wg.Add(1)
		go l.keep()
	}
	return l, nil
}

// URL is the address heads dial: relay://ADDR/NAME.
func (l *Listener) URL() string { return "relay://" + l.addr + "/" + l.name }

// Accept waits for a head's connection.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.accepted:
		return c, nil
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	}
}

// Close withdraws the registrations; connections already accepted go on.
func (l *Listener) Close() error {
	l.stop()
	l.mu.Lock()
	for c := range l.pending {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return nil
}

// Addr is the relay URL, as a net.Addr.
func (l *Listener) Addr() net.Addr { return urlAddr(l.URL()) }

type urlAddr string

func (a urlAddr) Network() string { return "relay" }
func (a urlAddr) String() string  { return string(a) }

// keep holds one registration at the relay, again and again.
func (l *Listener) keep() {
	defer l.wg.Done()
	var backoff time.Duration
	for l.ctx.Err() == nil {
		c, err := l.register()
		if err != nil {
			if l.ctx.Err() != nil {
				return
			}
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			l.opts.Log.Warn("relay registration failed; retrying", "relay", l.addr, "name", l.name, "err", err, "in", backoff)
			select {
			case <-time.After(backoff):
			case <-l.ctx.Done():
				return
			}
			continue
		}
		backoff = 0
		select {
		case l.accepted <- c:
		case <-l.ctx.Done():
			c.Close()
			return
		}
	}
}

// register dials the relay, registers and waits until a head is paired
// with the connection.
func (l *Listener) register() (net.Conn, error) {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(l.ctx, 10*time.Second)
	c, err := d.DialContext(dctx, "tcp", l.addr)
	cancel()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.ctx.Err() != nil {
		l.mu.Unlock()
		c.Close()
		return nil, l.ctx.Err()
	}
	l.pending[c] = struct{}{}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.pending, c)
		l.mu.Unlock()
	}()
	if _, err := fmt.Fprintf(c, "%s SERVE %s\n", version, l.name); err != nil {
		c.Close()
		return nil, err
	}
	line, err := readLine(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	if line != "PAIRED" {
		c.Close()
		return nil, fmt.Errorf("%w: %s", ErrRefused, line)
	}
	return c, nil
}
