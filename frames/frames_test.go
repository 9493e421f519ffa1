package frames

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/meshnet/shardd/bufpool/bufpooltest"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/stages/decode"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo answers each request with an Ack naming its work id, and Health
// with its state; it refuses Release with a status carrying details.
type echo struct {
	shardv1.UnimplementedShardRuntimeServer
}

func (echo) Session(ss grpc.BidiStreamingServer[shardv1.SessionRequest, shardv1.SessionResponse]) error {
	for {
		in := new(decode.Inbound)
		if err := ss.RecvMsg(in); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		id := strings.Clone(in.Msg.GetDecode().GetWorkId()) // the message aliases a buffer Release frees
		if id == "fail" {
			in.Release()
			return status.Error(codes.FailedPrecondition, "asked to fail")
		}
		resp := &shardv1.SessionResponse{Kind: &shardv1.SessionResponse_Ack{Ack: &shardv1.Ack{WorkId: id, ExecutionNanos: uint64(len(in.Msg.GetDecode().GetTensor().GetFragments()))}}}
		in.Release()
		if err := ss.Send(resp); err != nil {
			return err
		}
	}
}

func (echo) Health(context.Context, *shardv1.HealthRequest) (*shardv1.HealthReport, error) {
	return &shardv1.HealthReport{State: shardv1.ServingState_SERVING_STATE_DRAINING}, nil
}

func (echo) Release(context.Context, *shardv1.ReleaseRequest) (*shardv1.ReleaseResponse, error) {
	st, _ := status.New(codes.FailedPrecondition, "stale").WithDetails(&shardv1.ShardError{Code: shardv1.ErrorCode_ERROR_CODE_EPOCH_STALE, Detail: "stale"})
	return nil, st.Err()
}

// serveEcho starts a frame server of echo on loopback and a client of it.
func serveEcho(t *testing.T, maxRecv int) (string, *Client) {
	t.Helper()
	pool := bufpooltest.New(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Codec: decode.Codec{Pool: pool}, Pool: pool, MaxRecv: maxRecv}
	s := NewServer(echo{}, cfg)
	served := make(chan struct{})
	go func() { s.Serve(ln); close(served) }()
	t.Cleanup(func() { s.Close(); <-served })
	addr := ln.Addr().String()
	cl := NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}, Config{Codec: decode.Codec{Pool: pool}, Pool: pool, MaxRecv: 1 << 20})
	return addr, cl
}

func decodeReq(id string, payload int) *shardv1.SessionRequest {
	return &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Decode{Decode: &shardv1.DecodeStep{
		WorkId: id, Tensor: &shardv1.NamedTensor{Fragments: []*shardv1.TensorFragment{{Payload: make([]byte, payload)}}},
	}}}
}

// TestSessionRoundTrip: requests and responses in order, small and large
// (a pooled, aliased receive buffer), then a clean end as io.EOF; a
// handler's error reaches the client as its status.
func TestSessionRoundTrip(t *testing.T) {
	_, cl := serveEcho(t, 1<<20)
	ctx := context.Background()
	s, err := cl.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, size := range []int{0, 10, 100 << 10} {
		id := string(rune('a' + i))
		if err := s.Send(decodeReq(id, size)); err != nil {
			t.Fatal(err)
		}
		var resp decode.Response
		if err := s.RecvMsg(&resp); err != nil {
			t.Fatal(err)
		}
		if resp.Msg.GetAck().GetWorkId() != id {
			t.Fatalf("response %v to %q", &resp.Msg, id)
		}
		resp.Release()
	}
	s.CloseSend()
	if _, err := s.Recv(); err != io.EOF {
		t.Fatalf("after CloseSend: %v", err)
	}

	s, err = cl.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Send(decodeReq("fail", 0))
	if _, err := s.Recv(); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("handler error: %v", err)
	}
}

// TestUnary: responses and errors with ShardError details, as gRPC gives.
func TestUnary(t *testing.T) {
	_, cl := serveEcho(t, 1<<20)
	ctx := context.Background()
	h, err := cl.Health(ctx, &shardv1.HealthRequest{SchemaVersion: 1})
	if err != nil || h.State != shardv1.ServingState_SERVING_STATE_DRAINING {
		t.Fatalf("health %v %v", h, err)
	}
	_, err = cl.Release(ctx, &shardv1.ReleaseRequest{})
	st, _ := status.FromError(err)
	if st.Code() != codes.FailedPrecondition || len(st.Details()) != 1 || st.Details()[0].(*shardv1.ShardError).Code != shardv1.ErrorCode_ERROR_CODE_EPOCH_STALE {
		t.Fatalf("release: %v", err)
	}
	if _, err := cl.Cancel(ctx, &shardv1.CancelRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("cancel: %v", err)
	}
}

// TestOversizedFrame: a frame over MaxRecv ends the exchange with
// RESOURCE_EXHAUSTED before any of its payload is read.
func TestOversizedFrame(t *testing.T) {
	_, cl := serveEcho(t, 4096)
	s, err := cl.Session(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.Send(decodeReq("ok", 10))
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	s.Send(decodeReq("big", 8192))
	if _, err := s.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized frame: %v", err)
	}
}

// TestDeadContext: a client's ended context ends a blocked receive with
// the context's status, as on a gRPC stream.
func TestDeadContext(t *testing.T) {
	_, cl := serveEcho(t, 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	s, err := cl.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("got %v", err)
	}
}

// TestNotFrames: a connection that does not open with the preface, or
// opens with a frame of an unknown type, is closed without an answer the
// peer could mistake for a worker's.
func TestNotFrames(t *testing.T) {
	addr, _ := serveEcho(t, 1<<20)
	for _, b := range [][]byte{
		[]byte("GET / HTTP/1.1\r\n\r\n"),
		append([]byte(Preface), 0x7f, 0, 0, 0, 0),
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(b)
		got, _ := io.ReadAll(c)
		c.Close()
		if len(got) > 0 && got[0] != typeUnaryError {
			t.Fatalf("%q: answered %q", b, got)
		}
	}
}

// TestConnectionLimit: past MaxConns a new connection is closed at once;
// the ones already open are served.
func TestConnectionLimit(t *testing.T) {
	pool := bufpooltest.New(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(echo{}, Config{Codec: decode.Codec{Pool: pool}, Pool: pool, MaxRecv: 1 << 16, MaxConns: 2})
	served := make(chan struct{})
	go func() { s.Serve(ln); close(served) }()
	defer func() { s.Close(); <-served }()
	var open []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		open = append(open, c)
	}
	waitTracked := func(n int) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			s.mu.Lock()
			got := len(s.conns)
			s.mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d connections tracked, want %d", got, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitTracked(2)
	extra, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	extra.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := extra.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection past the limit was not closed: %d %v", n, err)
	}
	// The first two still work: a Health call on one of them.
	c := open[0]
	c.Write([]byte(Preface))
	req, _ := (&shardv1.HealthRequest{SchemaVersion: 1}).MarshalVT()
	hdr := []byte{typeHealthRequest, 0, 0, 0, byte(len(req))}
	c.Write(append(hdr, req...))
	var got [headerLen]byte
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, got[:]); err != nil || got[0] != typeHealthReport {
		t.Fatalf("a connection within the limit: %v %v", got, err)
	}
}

// FuzzServer feeds a frame server arbitrary bytes after the preface: it
// must never panic, leak a pooled buffer, or hang past the connection's
// end.
func FuzzServer(f *testing.F) {
	frame := func(typ byte, payload []byte) []byte {
		b := []byte{typ, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
		return append(b, payload...)
	}
	req, _ := decodeReq("x", 40).MarshalVT()
	f.Add(frame(typeSessionRequest, req))
	f.Add(append(frame(typeSessionRequest, req), frame(typeCloseSend, nil)...))
	f.Add(frame(typeHealthRequest, nil))
	f.Add(frame(typeReleaseRequest, []byte{0xff}))
	f.Add(frame(typeSessionRequest, []byte{0x1a, 0xff, 0xff, 0xff, 0x0f}))
	f.Fuzz(func(t *testing.T, data []byte) {
		pool := bufpooltest.New(t)
		s := NewServer(echo{}, Config{Codec: decode.Codec{Pool: pool}, Pool: pool, MaxRecv: 1 << 16})
		a, b := net.Pipe()
		done := make(chan struct{})
		go func() { io.Copy(io.Discard, a); close(done) }()
		s.wg.Add(1)
		if s.track(b) != tracked {
			t.Fatal("not tracked")
		}
		go s.serveConn(b)
		a.SetWriteDeadline(time.Now().Add(time.Second))
		a.Write([]byte(Preface))
		a.Write(data)
		a.Close()
		<-done
		s.Close()
	})
}
