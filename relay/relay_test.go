package relay

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start runs a relay on loopback; it is closed at cleanup.
func start(t *testing.T, r *Relay) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { r.Serve(ln); close(served) }()
	t.Cleanup(func() { r.Close(); <-served })
	return ln.Addr().String()
}

// pairUp registers a worker, dials it, and returns both ends.
func pairUp(t *testing.T, addr string, opts ListenOptions) (head, worker net.Conn, l *Listener) {
	t.Helper()
	l, err := Listen(addr, "w1", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	head, err = Dial(ctx, addr, "w1")
	if err != nil {
		t.Fatal(err)
	}
	worker, err = l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { head.Close(); worker.Close() })
	return head, worker, l
}

// TestOpaque: the relay carries any bytes unchanged, both ways, including
// what would be a frame header claiming 4 GiB: it parses nothing after the
// rendezvous, and it counts exactly what each side sent.
func TestOpaque(t *testing.T) {
	r := &Relay{}
	addr := start(t, r)
	head, worker, _ := pairUp(t, addr, ListenOptions{Idle: 1})
	up := append([]byte{0x01, 0xff, 0xff, 0xff, 0xff}, random(t, 300<<10)...)
	down := random(t, 1<<20)
	got := make(chan []byte, 2)
	go func() { b, _ := io.ReadAll(worker); got <- b }()
	go func() { b, _ := io.ReadAll(head); got <- b }()
	go func() { worker.Write(down); worker.(*net.TCPConn).CloseWrite() }()
	head.Write(up)
	head.(*net.TCPConn).CloseWrite()
	a, b := <-got, <-got
	if len(a) == len(down) {
		a, b = b, a
	}
	if !bytes.Equal(a, up) || !bytes.Equal(b, down) {
		t.Fatalf("bytes changed on the way: up %d/%d, down %d/%d", len(a), len(up), len(b), len(down))
	}
	waitFor(t, func() bool {
		s := r.Stats()
		return s.BytesToWorker == int64(len(up)) && s.BytesToHead == int64(len(down))
	})
	if s := r.Stats(); s.Paired != 1 || s.Refused != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestLatency: each direction is delayed by Latency.
func TestLatency(t *testing.T) {
	const lat = 30 * time.Millisecond
	addr := start(t, &Relay{Latency: lat})
	head, worker, _ := pairUp(t, addr, ListenOptions{Idle: 1})
	go io.Copy(worker, worker) // echo
	t0 := time.Now()
	head.Write([]byte("ping"))
	var b [4]byte
	if _, err := io.ReadFull(head, b[:]); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(t0); rtt < 2*lat {
		t.Fatalf("round trip %v through a relay adding %v each way", rtt, lat)
	}
}

// TestReregisters: a worker whose idle registration was taken registers
// again, and a registration that died (the worker went away) is never
// paired with a head.
func TestReregisters(t *testing.T) {
	r := &Relay{WaitTimeout: 2 * time.Second}
	addr := start(t, r)
	_, _, l := pairUp(t, addr, ListenOptions{Idle: 1})
	// The listener's next registration serves a second head.
	ctx := context.Background()
	h2, err := Dial(ctx, addr, "w1")
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Close()
	w2, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	// The worker withdraws; its registration dies at the relay, and a
	// head is refused instead of paired with it.
	l.Close()
	r.WaitTimeout = 100 * time.Millisecond
	if _, err := Dial(ctx, addr, "w1"); !errors.Is(err, ErrRefused) {
		t.Fatalf("dial after the worker left: %v", err)
	}
}

// TestResetAfter cuts a connection part way through what the worker sends.
func TestResetAfter(t *testing.T) {
	r := &Relay{}
	addr := start(t, r)
	head, worker, _ := pairUp(t, addr, ListenOptions{Idle: 1})
	if n := r.ResetAfter(100); n != 1 {
		t.Fatalf("armed %d", n)
	}
	go worker.Write(random(t, 64<<10))
	b, err := io.ReadAll(head)
	if err == nil && len(b) >= 64<<10 {
		t.Fatal("the whole response arrived")
	}
	if len(b) > 100 {
		t.Fatalf("%d bytes arrived before the reset at 100", len(b))
	}
}

// TestBadRendezvous: anything but a rendezvous line is refused.
func TestBadRendezvous(t *testing.T) {
	r := &Relay{}
	addr := start(t, r)
	for _, line := range []string{"GET / HTTP/1.1\n", "SHARDD-RELAY/1 DIAL ../etc\n", "SHARDD-RELAY/1 SERVE\n"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(line))
		b, _ := io.ReadAll(c)
		c.Close()
		if !bytes.HasPrefix(b, []byte("ERR ")) {
			t.Fatalf("%q: got %q", line, b)
		}
	}
	for _, u := range []string{"relay://h:1", "relay://h:1/", "http://h:1/x", "relay://h:1/a/b", "relay://h:1/x?y=1"} {
		if _, _, err := ParseURL(u); !errors.Is(err, ErrURL) {
			t.Fatalf("%q: %v", u, err)
		}
	}
	if a, n, err := ParseURL("relay://127.0.0.1:7000/shard-1"); err != nil || a != "127.0.0.1:7000" || n != "shard-1" {
		t.Fatalf("%v %v %v", a, n, err)
	}
}

func random(t *testing.T, n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// waitFor spins on cond (counters the test cannot be signalled about).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

// A registration whose worker went away leaves its name's queue at once:
// it does not hold one of the MaxIdle places until a head comes by.
func TestDeadRegistrationFreesItsPlace(t *testing.T) {
	r := &Relay{MaxIdle: 1, WaitTimeout: 2 * time.Second}
	addr := start(t, r)
	serve := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(version + " SERVE w\n"))
		return c
	}
	dead := serve()
	waitFor(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.idle["w"] != nil && len(r.idle["w"].waiters) == 1
	})
	dead.Close()
	waitFor(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return len(r.idle["w"].waiters) == 0 })
	live := serve()
	defer live.Close()
	head, err := Dial(context.Background(), addr, "w")
	if err != nil {
		t.Fatalf("a live registration after a dead one: %v", err)
	}
	defer head.Close()
	var b [7]byte
	if _, err := io.ReadFull(live, b[:]); err != nil || string(b[:]) != "PAIRED\n" {
		t.Fatalf("the live registration read %q %v", b, err)
	}
	waitFor(t, func() bool { return r.Stats().Paired == 1 }) // counted just after the OK
	if s := r.Stats(); s.Refused != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// Past MaxConns a new connection is closed before it can say anything;
// closing one makes room again.
func TestRelayConnectionLimit(t *testing.T) {
	r := &Relay{MaxConns: 2}
	addr := start(t, r)
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	waitFor(t, func() bool { return r.conns.Load() == 2 })
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("past the limit: %d %v", n, err)
	}
	held[0].Write([]byte("junk\n")) // refused and closed: room for one more
	waitFor(t, func() bool { return r.conns.Load() == 1 })
	if s := r.Stats(); s.Refused != 2 {
		t.Fatalf("stats %+v", s)
	}
}
