package frames

import (
	"context"
	"io"
	"net"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// Dialer opens a byte stream to a worker within ctx: a TCP connection, or
// one through a relay (relay.Dial), with TLS on top where asked for.
type Dialer func(ctx context.Context) (net.Conn, error)

// Client is a shardv1.ShardRuntimeClient whose calls travel as frames: each
// Session exchange and each unary call on a connection of its own. Errors
// are gRPC statuses as a gRPC client returns them: a worker's status as it
// sent it (ShardError details included), Unavailable for a connection that
// failed, Canceled or DeadlineExceeded when ctx ended.
type Client struct {
	dial Dialer
	cfg  Config
}

var _ shardv1.ShardRuntimeClient = (*Client)(nil)

// NewClient returns a client that opens its connections with dial.
func NewClient(dial Dialer, cfg Config) *Client {
	cfg.defaults()
	return &Client{dial: dial, cfg: cfg}
}

// connect dials, and queues the preface to go out with the first frame.
func (cl *Client) connect(ctx context.Context) (*conn, error) {
	nc, err := cl.dial(ctx)
	if err != nil {
		return nil, transportStatus(ctx, err)
	}
	c := newConn(nc, cl.cfg.Codec, cl.cfg.Pool, cl.cfg.MaxRecv, cl.cfg.WriteTimeout)
	c.preface = true
	return c, nil
}

// transportStatus is a failed connection's error as gRPC reports it.
func transportStatus(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unavailable, "frames: "+err.Error())
}

// readStatus decodes a google.rpc.Status payload of n bytes.
func readStatus(c *conn, n int) error {
	if n == 0 {
		return nil
	}
	var p spb.Status
	buf, err := c.readPayload(n)
	if err != nil {
		return err
	}
	defer buf.Free()
	if err := proto.Unmarshal(buf.ReadOnlyData(), &p); err != nil {
		return status.Error(codes.Internal, "frames: undecodable status")
	}
	return status.FromProto(&p).Err()
}

// Session opens a Session exchange on a new connection.
func (cl *Client) Session(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[shardv1.SessionRequest, shardv1.SessionResponse], error) {
	c, err := cl.connect(ctx)
	if err != nil {
		return nil, err
	}
	cs := &clientStream{ctx: ctx, c: c}
	// Ending ctx closes the connection, which ends a blocked read or write.
	cs.stop = context.AfterFunc(ctx, func() { c.nc.Close() })
	return cs, nil
}

// clientStream is the head's side of a Session exchange. One goroutine
// sends and one receives, as on a gRPC stream.
type clientStream struct {
	ctx  context.Context
	c    *conn
	stop func() bool
	// done is the exchange's end as the receiver saw it (io.EOF: the
	// worker ended it OK); owned by the receiving goroutine.
	done error
}

var _ grpc.BidiStreamingClient[shardv1.SessionRequest, shardv1.SessionResponse] = (*clientStream)(nil)

func (cs *clientStream) Header() (metadata.MD, error) { return metadata.MD{}, nil }
func (cs *clientStream) Trailer() metadata.MD         { return metadata.MD{} }
func (cs *clientStream) Context() context.Context     { return cs.ctx }

func (cs *clientStream) Send(m *shardv1.SessionRequest) error { return cs.SendMsg(m) }

// SendMsg writes one SessionRequest.
func (cs *clientStream) SendMsg(m any) error {
	if err := cs.c.writeMsg(typeSessionRequest, m); err != nil {
		return transportStatus(cs.ctx, err)
	}
	return nil
}

// CloseSend tells the worker no more requests follow; responses go on.
func (cs *clientStream) CloseSend() error {
	if err := cs.c.writeFrame(typeCloseSend, nil); err != nil {
		return transportStatus(cs.ctx, err)
	}
	return nil
}

func (cs *clientStream) Recv() (*shardv1.SessionResponse, error) {
	m := new(shardv1.SessionResponse)
	if err := cs.RecvMsg(m); err != nil {
		return nil, err
	}
	return m, nil
}

// RecvMsg reads the next SessionResponse into m (a *shardv1.SessionResponse
// or a *decode.Response, which aliases the receive buffer). It returns
// io.EOF when the worker ended the exchange OK, and the worker's status when
// it ended it with an error; the connection is closed then.
func (cs *clientStream) RecvMsg(m any) error {
	if cs.done != nil {
		return cs.done
	}
	typ, n, err := cs.c.readHeader()
	if err != nil {
		return cs.finish(transportStatus(cs.ctx, err))
	}
	switch typ {
	case typeSessionResponse:
		if err := cs.c.readMsg(n, m); err != nil {
			return cs.finish(transportStatus(cs.ctx, err))
		}
		return nil
	case typeEnd:
		if err := readStatus(cs.c, n); err != nil {
			return cs.finish(err)
		}
		return cs.finish(io.EOF)
	}
	return cs.finish(status.Errorf(codes.Internal, "%v: type %#x in a session", ErrProtocol, typ))
}

func (cs *clientStream) finish(err error) error {
	cs.done = err
	cs.stop()
	cs.c.nc.Close()
	return err
}

// unary makes one call on a connection of its own.
func (cl *Client) unary(ctx context.Context, reqTyp byte, req any, respTyp byte, resp any) error {
	c, err := cl.connect(ctx)
	if err != nil {
		return err
	}
	defer c.nc.Close()
	stop := context.AfterFunc(ctx, func() { c.nc.Close() })
	defer stop()
	if err := c.writeMsg(reqTyp, req); err != nil {
		return transportStatus(ctx, err)
	}
	typ, n, err := c.readHeader()
	if err != nil {
		return transportStatus(ctx, err)
	}
	switch typ {
	case respTyp:
		if err := c.readMsg(n, resp); err != nil {
			return transportStatus(ctx, err)
		}
		return nil
	case typeUnaryError, typeEnd:
		if err := readStatus(c, n); err != nil {
			return err
		}
		return status.Error(codes.Internal, "frames: error frame without an error")
	}
	return status.Errorf(codes.Internal, "%v: type %#x answering a call", ErrProtocol, typ)
}

// call makes one unary call with a response of type R.
func call[R any](cl *Client, ctx context.Context, reqTyp byte, req any, respTyp byte) (*R, error) {
	out := new(R)
	if err := cl.unary(ctx, reqTyp, req, respTyp, out); err != nil {
		return nil, err
	}
	return out, nil
}

// GetCapability asks what the worker can execute.
func (cl *Client) GetCapability(ctx context.Context, in *shardv1.CapabilityRequest, _ ...grpc.CallOption) (*shardv1.CapabilityReport, error) {
	return call[shardv1.CapabilityReport](cl, ctx, typeCapabilityRequest, in, typeCapabilityReport)
}

// Health asks for the worker's live load.
func (cl *Client) Health(ctx context.Context, in *shardv1.HealthRequest, _ ...grpc.CallOption) (*shardv1.HealthReport, error) {
	return call[shardv1.HealthReport](cl, ctx, typeHealthRequest, in, typeHealthReport)
}

// Release drops a session's state out of band.
func (cl *Client) Release(ctx context.Context, in *shardv1.ReleaseRequest, _ ...grpc.CallOption) (*shardv1.ReleaseResponse, error) {
	return call[shardv1.ReleaseResponse](cl, ctx, typeReleaseRequest, in, typeReleaseResponse)
}

// Cancel abandons queued work out of band, on a connection of its own.
func (cl *Client) Cancel(ctx context.Context, in *shardv1.CancelRequest, _ ...grpc.CallOption) (*shardv1.CancelResponse, error) {
	return call[shardv1.CancelResponse](cl, ctx, typeCancelRequest, in, typeCancelResponse)
}
