// Package frames carries the ShardRuntime service over any ordered byte
// stream, as serialized contract messages in length-prefixed frames: the
// transport of a hop that has no direct gRPC connection and goes through a
// relay (package relay) instead.
//
// Why a plain byte stream with a length prefix. A relay between nodes behind
// NAT splices two outbound TCP connections and copies bytes; what it can
// carry is an ordered byte stream and nothing more (no HTTP/2 streams, no
// metadata, no deadlines, no flow-control windows). A length prefix is the
// least framing that makes such a stream self-delimiting, and it is what
// gRPC itself puts in front of every message. WebSocket would add an HTTP
// upgrade and per-frame masking that serve browsers and HTTP proxies, which
// a node-to-node relay does not cross. Everything a hop needs beyond the
// bytes is already in the contract's messages: deadlines and identity in
// the envelope, flow control as credits, errors as ShardStatus.
//
// The wire. The initiator opens a connection with the 8-byte preface
// "SHARDDF1"; then each frame is a 1-byte type, a 4-byte big-endian payload
// length and the payload, a message serialized exactly as on a gRPC hop.
// A connection carries either one Session exchange or a sequence of unary
// calls, as its first frame says:
//
//	session:  -> SessionRequest ... [CloseSend]
//	          <- SessionResponse ... End(google.rpc.Status; empty: OK)
//	unary:    -> CapabilityRequest | HealthRequest | ReleaseRequest | CancelRequest
//	          <- the matching response, or UnaryError(google.rpc.Status)
//
// Unary calls have their own connection, so a Cancel reaches a worker whose
// session connection is wedged behind flow control. A unary error carries
// the same google.rpc.Status a gRPC hop would, ShardError details included.
//
// The worker side (Server) runs the unchanged ShardRuntime handlers, the
// engine's, behind adapters for grpc.BidiStreamingServer: the same stages,
// the same codec and the same pooled receive buffers, one read of the socket
// into one pooled buffer that the decoded message then aliases (as a gRPC
// message that arrived in one HTTP/2 frame). The stream's context has no
// deadline and no metadata: whatever the worker must know comes in-band, so
// a relayed hop proves that nothing relies on gRPC for it. The head side
// (Client) implements shardv1.ShardRuntimeClient, so the route client and
// the tests drive a relayed hop through the same calls as a direct one.
package frames
