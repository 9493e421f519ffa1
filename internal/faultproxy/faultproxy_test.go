package faultproxy

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
)

// sink accepts one connection and hands it over.
func sink(t *testing.T) (string, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			got <- c
		}
	}()
	return ln.Addr().String(), got
}

func dial(t *testing.T, target string) (*Proxy, net.Conn) {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return p, c
}

func setup(t *testing.T) (*Proxy, net.Conn, net.Conn) {
	t.Helper()
	target, accepted := sink(t)
	p, c := dial(t, target)
	var s net.Conn
	select {
	case s = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the proxy did not connect to the target")
	}
	t.Cleanup(func() { s.Close() })
	// Wait until the proxy has registered the link.
	for deadline := time.Now().Add(5 * time.Second); len(p.live()) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no live link")
		}
		time.Sleep(time.Millisecond)
	}
	return p, c, s
}

func TestForwardsBothWaysAndHalfClose(t *testing.T) {
	_, c, s := setup(t)
	msg := bytes.Repeat([]byte("abc"), 50000)
	go func() { c.Write(msg); c.(*net.TCPConn).CloseWrite() }()
	got, err := io.ReadAll(s)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("target read %d bytes (err %v), want %d", len(got), err, len(msg))
	}
	s.Write([]byte("reply"))
	s.(*net.TCPConn).CloseWrite()
	back, err := io.ReadAll(c)
	if err != nil || string(back) != "reply" {
		t.Fatalf("client read %q, %v", back, err)
	}
}

func TestResetAfterCutsMidMessage(t *testing.T) {
	p, c, s := setup(t)
	if n := p.ResetAfter(1000); n != 1 {
		t.Fatalf("armed %d links, want 1", n)
	}
	go c.Write(make([]byte, 100000))
	got, err := io.ReadAll(s)
	if len(got) != 1000 {
		t.Fatalf("target got %d bytes before the reset, want exactly 1000", len(got))
	}
	if err == nil {
		t.Fatal("the target saw a clean end, want a reset")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("client read after the reset: %v, want a connection error", err)
	}
	if st := p.Stats(); st.Resets != 1 || st.Accepted != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestStallHoldsBothDirections(t *testing.T) {
	p, c, s := setup(t)
	p.Stall(300 * time.Millisecond)
	start := time.Now()
	c.Write([]byte("x"))
	buf := make([]byte, 1)
	if _, err := io.ReadFull(s, buf); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("a byte crossed a stalled link in %v", d)
	}
	// After the stall the link is as before.
	start = time.Now()
	s.Write([]byte("y"))
	if _, err := io.ReadFull(c, buf); err != nil || buf[0] != 'y' {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Fatalf("the link stayed slow after the stall: %v", d)
	}
}

func TestStopReadingBacksUpTheTarget(t *testing.T) {
	p, c, s := setup(t)
	p.StopReading(2 * time.Second)
	// The target writes until its socket and the proxy's fill; a write
	// then blocks, which its deadline reports.
	s.SetWriteDeadline(time.Now().Add(time.Second))
	chunk := make([]byte, 64<<10)
	var wrote int
	var err error
	for wrote < 256<<20 && err == nil {
		var n int
		n, err = s.Write(chunk)
		wrote += n
	}
	if !isTimeout(err) {
		t.Fatalf("the target wrote %d bytes to a peer that stopped reading (err %v), want a blocked write", wrote, err)
	}
	// Forwarding toward the target still works meanwhile.
	c.Write([]byte("z"))
	buf := make([]byte, 1)
	s.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := io.ReadFull(s, buf); err != nil {
		t.Fatalf("toward the target: %v", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
