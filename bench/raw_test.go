package bench

import (
	"fmt"
	"io"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// rawCodec passes *[]byte through untouched: the baseline is gRPC itself,
// with no protobuf and no processing.
type rawCodec struct{}

var _ encoding.CodecV2 = rawCodec{}

func (rawCodec) Name() string { return "raw" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("raw codec: %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: %T", v)
	}
	*b = data.Materialize()
	return nil
}

// rawServer replies to each message with reply bytes.
type rawServer struct{ reply []byte }

var rawDesc = grpc.ServiceDesc{
	ServiceName: "bench.Raw",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName: "Echo", ServerStreams: true, ClientStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			s := srv.(*rawServer)
			for {
				var in []byte
				if err := ss.RecvMsg(&in); err != nil {
					if err == io.EOF {
						return nil
					}
					return err
				}
				if err := ss.SendMsg(&s.reply); err != nil {
					return err
				}
			}
		},
	}},
}

// startRaw serves the raw echo on loopback and returns a client stream.
func startRaw(b *testing.B, replyBytes int) grpc.ClientStream {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}), grpc.MaxRecvMsgSize(64<<20))
	srv.RegisterService(&rawDesc, &rawServer{reply: make([]byte, replyBytes)})
	go srv.Serve(lis)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{}), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		b.Fatal(err)
	}
	cs, err := conn.NewStream(b.Context(), &rawDesc.Streams[0], "/bench.Raw/Echo")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cs.CloseSend(); conn.Close(); srv.Stop() })
	return cs
}
