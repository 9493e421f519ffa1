package frames

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// Config is what a frame connection needs on either side.
type Config struct {
	// Codec marshals and unmarshals the contract's messages (the worker's
	// zero-copy codec, decode.Codec).
	Codec encoding.CodecV2
	// Pool supplies the receive buffers.
	Pool mem.BufferPool
	// MaxRecv bounds one received frame's payload, as gRPC's
	// MaxRecvMsgSize does; a larger frame ends the connection with
	// RESOURCE_EXHAUSTED before any of it is read.
	MaxRecv int
	// WriteTimeout bounds one frame's write (default 1 minute): a peer
	// that stops reading for that long loses the connection.
	WriteTimeout time.Duration
	// MaxConns bounds the open connections (default 1024); one more is
	// closed at once. Each holds a goroutine and a read buffer, and one
	// that never sends its preface holds them for prefaceTimeout.
	MaxConns int
	// Log receives connection-level failures (default: discarded).
	Log *slog.Logger
}

func (c *Config) defaults() {
	if c.WriteTimeout == 0 {
		c.WriteTimeout = time.Minute
	}
	if c.MaxConns == 0 {
		c.MaxConns = 1024
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// prefaceTimeout bounds how long a new connection may take to say what it
// is.
const prefaceTimeout = 10 * time.Second

// Server serves a ShardRuntimeServer (the engine) on frame connections.
type Server struct {
	impl shardv1.ShardRuntimeServer
	cfg  Config
	ctx  context.Context // canceled by Close: ends every exchange
	stop context.CancelFunc

	mu        sync.Mutex // guards the fields below
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{}
	closed    bool

	wg   sync.WaitGroup // serveConn goroutines
	idle *sync.Cond     // on mu: signalled when a connection ends
}

// NewServer returns a server of impl.
func NewServer(impl shardv1.ShardRuntimeServer, cfg Config) *Server {
	cfg.defaults()
	ctx, stop := context.WithCancel(context.Background())
	s := &Server{impl: impl, cfg: cfg, ctx: ctx, stop: stop, listeners: map[net.Listener]struct{}{}, conns: map[net.Conn]struct{}{}}
	s.idle = sync.NewCond(&s.mu)
	return s
}

// Serve accepts connections on lis until lis or the server is closed.
func (s *Server) Serve(lis net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		lis.Close()
		return net.ErrClosed
	}
	s.listeners[lis] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, lis)
		s.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := lis.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		switch s.track(nc) {
		case trackClosed:
			nc.Close()
			return net.ErrClosed
		case trackFull:
			s.cfg.Log.Warn("frames: connection refused: at the connection limit", "limit", s.cfg.MaxConns)
			nc.Close()
			continue
		}
		s.wg.Add(1)
		go s.serveConn(nc)
	}
}

type trackResult int

const (
	tracked trackResult = iota
	trackClosed
	trackFull
)

func (s *Server) track(nc net.Conn) trackResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return trackClosed
	}
	if len(s.conns) >= s.cfg.MaxConns {
		return trackFull
	}
	s.conns[nc] = struct{}{}
	return tracked
}

func (s *Server) untrack(nc net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, nc)
	s.idle.Broadcast()
}

// StopAccepting closes the listeners; open connections go on.
func (s *Server) StopAccepting() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for l := range s.listeners {
		l.Close()
	}
}

// Shutdown stops accepting and waits until every connection has ended (its
// initiator closed it) or ctx ends, then closes the rest.
func (s *Server) Shutdown(ctx context.Context) {
	s.StopAccepting()
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.idle.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.mu.Lock()
	for len(s.conns) > 0 && ctx.Err() == nil {
		s.idle.Wait()
	}
	s.mu.Unlock()
	s.Close()
}

// Close stops accepting, ends every exchange and closes every connection,
// then waits for their goroutines.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.stop()
	s.wg.Wait()
}

// serveConn reads the preface and the first frame, which decides whether
// the connection carries a Session exchange or unary calls.
func (s *Server) serveConn(nc net.Conn) {
	defer s.wg.Done()
	defer s.untrack(nc)
	defer nc.Close()
	c := newConn(nc, s.cfg.Codec, s.cfg.Pool, s.cfg.MaxRecv, s.cfg.WriteTimeout)
	nc.SetReadDeadline(time.Now().Add(prefaceTimeout))
	var pre [len(Preface)]byte
	if _, err := io.ReadFull(c.r, pre[:]); err != nil || string(pre[:]) != Preface {
		s.cfg.Log.Debug("frames: refused a connection", "remote", nc.RemoteAddr().String(), "err", ErrPreface)
		return
	}
	typ, n, err := c.readHeader()
	nc.SetReadDeadline(time.Time{})
	if err != nil {
		s.end(c, err)
		return
	}
	if typ == typeSessionRequest {
		s.session(c, n)
		return
	}
	s.unary(c, typ, n)
}

// end writes the exchange's final status (nil: OK).
func (s *Server) end(c *conn, err error) {
	var st *spb.Status
	if err != nil {
		st = wireStatus(err).Proto()
	}
	if st == nil {
		c.writeFrame(typeEnd, nil)
		return
	}
	c.writeMsg(typeEnd, st)
}

// wireStatus is the status a peer sees for a handler's or the transport's
// error: a gRPC status as it is; a frame-size violation as
// RESOURCE_EXHAUSTED, as gRPC reports an oversized message; anything else
// as UNKNOWN with no detail (the cause stays in the local log).
func wireStatus(err error) *status.Status {
	if st, ok := status.FromError(err); ok {
		return st
	}
	switch {
	case errors.Is(err, ErrFrameSize):
		return status.New(codes.ResourceExhausted, "frames: frame exceeds the size limit")
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, "frames: exchange cancelled")
	}
	return status.New(codes.Unknown, "frames: exchange failed")
}

// session runs the Session handler on c; the first frame's header, a
// SessionRequest of n bytes, has been read.
func (s *Server) session(c *conn, n int) {
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	ss := &serverStream{ctx: ctx, cancel: cancel, c: c, first: n, hasFirst: true}
	err := s.impl.Session(ss)
	if err == nil || !isConnErr(err) {
		s.end(c, err)
	} // else the initiator went away: nobody to tell
	if ss.watched != nil {
		c.nc.Close()
		<-ss.watched
	}
}

// serverStream is a Session exchange on one connection, as the handler sees
// a gRPC stream. The handler's goroutine receives; its send goroutine
// sends.
type serverStream struct {
	ctx    context.Context
	cancel context.CancelFunc
	c      *conn

	// Owned by the receiving goroutine.
	first    int  // the first frame's payload length, header already read
	hasFirst bool // first is still to be read
	recvErr  error
	watched  chan struct{} // closed when watch returns (nil: not started)
}

var _ grpc.BidiStreamingServer[shardv1.SessionRequest, shardv1.SessionResponse] = (*serverStream)(nil)

func (ss *serverStream) Context() context.Context     { return ss.ctx }
func (ss *serverStream) SetHeader(metadata.MD) error  { return nil }
func (ss *serverStream) SendHeader(metadata.MD) error { return nil }
func (ss *serverStream) SetTrailer(metadata.MD)       {}

func (ss *serverStream) Send(m *shardv1.SessionResponse) error { return ss.SendMsg(m) }

// SendMsg writes one SessionResponse (or a decode.Spliced one).
func (ss *serverStream) SendMsg(m any) error {
	if err := ss.ctx.Err(); err != nil {
		return err
	}
	return ss.c.writeMsg(typeSessionResponse, m)
}

func (ss *serverStream) Recv() (*shardv1.SessionRequest, error) {
	m := new(shardv1.SessionRequest)
	if err := ss.RecvMsg(m); err != nil {
		return nil, err
	}
	return m, nil
}

// RecvMsg reads the next SessionRequest into m; io.EOF after the
// initiator's CloseSend. After CloseSend the connection is still watched:
// if the initiator goes away, the exchange's context ends.
func (ss *serverStream) RecvMsg(m any) error {
	if ss.recvErr != nil {
		return ss.recvErr
	}
	err := ss.recv(m)
	if err != nil {
		ss.recvErr = err
		if err == io.EOF {
			ss.watched = make(chan struct{})
			go ss.watch()
		}
	}
	return err
}

func (ss *serverStream) recv(m any) error {
	n := ss.first
	if ss.hasFirst {
		ss.hasFirst = false
	} else {
		var typ byte
		var err error
		if typ, n, err = ss.c.readHeader(); err != nil {
			return err
		}
		switch typ {
		case typeSessionRequest:
		case typeCloseSend:
			if err := ss.c.discard(n); err != nil {
				return err
			}
			return io.EOF
		default:
			return status.Errorf(codes.InvalidArgument, "%v: type %#x in a session", ErrProtocol, typ)
		}
	}
	if err := ss.c.readMsg(n, m); err != nil {
		if isConnErr(err) {
			return err
		}
		// A payload that is not a SessionRequest, as gRPC reports it.
		return status.Error(codes.Internal, "frames: cannot decode a SessionRequest")
	}
	return nil
}

// watch ends the exchange's context when the initiator closes the
// connection or sends anything after CloseSend.
func (ss *serverStream) watch() {
	defer close(ss.watched)
	var b [1]byte
	ss.c.r.Read(b[:])
	ss.cancel()
}

// unary serves unary calls on c until the initiator closes it; the first
// call's header (typ, n) has been read.
func (s *Server) unary(c *conn, typ byte, n int) {
	for {
		if err := s.call(c, typ, n); err != nil {
			s.cfg.Log.Debug("frames: unary connection ended", "err", err)
			return
		}
		var err error
		if typ, n, err = c.readHeader(); err != nil {
			if errors.Is(err, ErrFrameSize) {
				s.end(c, err)
			}
			return
		}
	}
}

// call answers one unary request. It returns an error only when the
// connection cannot go on.
func (s *Server) call(c *conn, typ byte, n int) error {
	var req, resp any
	var respTyp byte
	switch typ {
	case typeCapabilityRequest:
		req, respTyp = new(shardv1.CapabilityRequest), typeCapabilityReport
	case typeHealthRequest:
		req, respTyp = new(shardv1.HealthRequest), typeHealthReport
	case typeReleaseRequest:
		req, respTyp = new(shardv1.ReleaseRequest), typeReleaseResponse
	case typeCancelRequest:
		req, respTyp = new(shardv1.CancelRequest), typeCancelResponse
	default:
		c.writeMsg(typeUnaryError, status.New(codes.Unimplemented, "frames: unknown call").Proto())
		return ErrProtocol
	}
	if err := c.readMsg(n, req); err != nil {
		if isConnErr(err) {
			return err
		}
		return c.writeMsg(typeUnaryError, status.New(codes.InvalidArgument, "frames: cannot decode the request").Proto())
	}
	var err error
	switch r := req.(type) {
	case *shardv1.CapabilityRequest:
		resp, err = s.impl.GetCapability(s.ctx, r)
	case *shardv1.HealthRequest:
		resp, err = s.impl.Health(s.ctx, r)
	case *shardv1.ReleaseRequest:
		resp, err = s.impl.Release(s.ctx, r)
	case *shardv1.CancelRequest:
		resp, err = s.impl.Cancel(s.ctx, r)
	}
	if err != nil {
		return c.writeMsg(typeUnaryError, wireStatus(err).Proto())
	}
	return c.writeMsg(respTyp, resp)
}

// isConnErr reports whether err is the connection failing (nobody left to
// answer) rather than a peer's bad message.
func isConnErr(err error) bool {
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || errors.As(err, &ne)
}
