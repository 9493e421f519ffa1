// Package decode is the first receive stage: a gRPC CodecV2 that decodes
// ShardRuntime frames with vtprotobuf's unsafe unmarshal, so fragment
// payloads and strings alias the received buffer instead of being copied.
//
// The name is the design's: its stages read "decode (vtproto) ->
// reassemble -> checksum -> decompress -> schedule -> forward -> frame
// out", and each stage is a package under stages/ of that name. Here
// "decode" is always the wire's protobuf decoding; the LLM's decode step
// (one token per session) is the engine's and the route's word, and no
// package is named for it. Imported as decode, the package's identifiers
// say which they are: decode.Codec, decode.Inbound, decode.Response,
// decode.Spliced.
//
// The codec is installed on the ShardRuntime server only, with
// grpc.ForceServerCodecV2; it is never registered globally. Since a forced
// codec serves every service on that server (health, reflection), messages
// other than the project's own fall back to the protobuf runtime.
//
// Zero copy, and where a copy still happens: gRPC hands the codec a message as
// a mem.BufferSlice of the HTTP/2 data frames it arrived in. A message that
// arrived in one frame is aliased: the codec takes a reference on that buffer
// and keeps it until Inbound.Release. A message spanning several frames (any
// message larger than the peer's HTTP/2 max frame size, 16 KiB by default) is
// materialized once into one pooled buffer, which is then aliased the same
// way. That single copy is the only one between the socket and the backend's
// batch for an uncompressed tensor.
//
// The head reads responses the same way (Response). On the way out, a
// worker's result chunk is marshaled as a Spliced: its large payloads are
// handed to gRPC in the result buffer itself rather than copied.
package decode

import (
	"fmt"
	"time"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// Inbound is one received SessionRequest whose bytes may alias the receive
// buffer. The owner (the stream's receive goroutine, then whichever stage it
// hands the message to) calls Release exactly once when no stage needs Msg's
// bytes any more. Msg is read-only: its byte slices and strings alias memory
// that returns to the pool on Release; strings that outlive it are cloned.
//
// An Inbound is reusable: Release keeps the SessionRequest and its oneof
// wrapper and resets only what they hold, so a stream that receives decode
// steps back to back decodes each one without allocating.
type Inbound struct {
	Msg *shardv1.SessionRequest

	buf          mem.Buffer // reference held until Release; nil when released
	materialized bool
	// DecodeStart and DecodeEnd bracket the unmarshal (for tracing).
	DecodeStart, DecodeEnd time.Time
	// spare is the decode oneof wrapper kept from the last decode step, handed
	// back to the generated unmarshal (which reuses a wrapper of the right
	// kind) only when the next frame starts with the decode field.
	spare *shardv1.SessionRequest_Decode
}

// decodeTag is the key of SessionRequest.decode (field 3, length-delimited).
const decodeTag = 3<<3 | 2

// Live reports whether the Inbound holds a received message.
func (in *Inbound) Live() bool { return in.buf != nil }

// Release resets the message (returning its nested messages to their pools)
// and drops the reference on the receive buffer. Release on a released or
// empty Inbound is a no-op.
func (in *Inbound) Release() {
	if in.buf == nil {
		return
	}
	scrub(in.Msg)
	if k, ok := in.Msg.Kind.(*shardv1.SessionRequest_Decode); ok {
		k.Decode.ResetVT()
		in.spare = k
		in.Msg.Kind = nil
	}
	in.Msg.ResetVT()
	in.buf.Free()
	in.buf = nil
}

// scrub drops every byte field that may alias the receive buffer before the
// message's parts go back to vtprotobuf's pools. The generated ResetVT keeps
// a bytes field's capacity (Payload[:0]) for reuse; a pooled object that
// still pointed into a released receive buffer would let the next safe
// UnmarshalVT append into memory that now belongs to someone else.
func scrub(m *shardv1.SessionRequest) {
	switch k := m.Kind.(type) {
	case *shardv1.SessionRequest_Decode:
		scrubTensor(k.Decode.GetTensor())
	case *shardv1.SessionRequest_Chunk:
		for _, nt := range k.Chunk.GetBundle().GetTensors() {
			scrubTensor(nt)
		}
	}
}

// scrubResponse is scrub for a response (the head's side).
func scrubResponse(m *shardv1.SessionResponse) {
	if k, ok := m.Kind.(*shardv1.SessionResponse_Chunk); ok {
		for _, nt := range k.Chunk.GetBundle().GetTensors() {
			scrubTensor(nt)
		}
	}
}

func scrubTensor(nt *shardv1.NamedTensor) {
	if nt == nil {
		return
	}
	for _, f := range nt.Fragments {
		f.Payload = nil
	}
	if nt.Checksum != nil {
		nt.Checksum.Value = nil
	}
}

// Response is one received SessionResponse whose bytes alias the receive
// buffer: the head's counterpart of Inbound, so a last hop's logits reach the
// sampler without being copied out of the message. The owner calls Release
// exactly once when nothing needs Msg's bytes any more; until then Msg is
// read-only. A Response is reusable after Release.
type Response struct {
	Msg shardv1.SessionResponse

	buf mem.Buffer // reference held until Release; nil when released
}

// Release returns the message's nested parts to vtprotobuf's pools and drops
// the reference on the receive buffer. Release on a released Response is a
// no-op.
func (r *Response) Release() {
	if r.buf == nil {
		return
	}
	scrubResponse(&r.Msg)
	r.Msg.ResetVT()
	r.buf.Free()
	r.buf = nil
}

// Len is the size of the received message in bytes.
func (in *Inbound) Len() int {
	if in.buf == nil {
		return 0
	}
	return in.buf.Len()
}

// Materialized reports whether the message had to be copied into one buffer
// because it arrived in several frames (for tests and metrics).
func (in *Inbound) Materialized() bool { return in.materialized }

type vtMessage interface {
	SizeVT() int
	MarshalToSizedBufferVT([]byte) (int, error)
	UnmarshalVT([]byte) error
}

// Codec is the ShardRuntime server codec. Pool supplies marshal buffers and
// the buffer for materializing multi-frame messages.
type Codec struct {
	Pool mem.BufferPool
}

var _ encoding.CodecV2 = Codec{}

// Name is "proto", so peers using the standard codec interoperate.
func (Codec) Name() string { return "proto" }

// Marshal encodes v into one pooled buffer (vtprotobuf messages) or through
// the protobuf runtime.
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	switch m := v.(type) {
	case *Spliced:
		return c.marshalSpliced(m)
	case vtMessage:
		size := m.SizeVT()
		if mem.IsBelowBufferPoolingThreshold(size) {
			// gRPC never returns buffers this small to a pool.
			b := make([]byte, size)
			if _, err := m.MarshalToSizedBufferVT(b); err != nil {
				return nil, fmt.Errorf("decode: marshal %T: %w", v, err)
			}
			return mem.BufferSlice{mem.SliceBuffer(b)}, nil
		}
		buf := c.Pool.Get(size)
		if _, err := m.MarshalToSizedBufferVT((*buf)[:size]); err != nil {
			c.Pool.Put(buf)
			return nil, fmt.Errorf("decode: marshal %T: %w", v, err)
		}
		// Given back when gRPC returns it or drops it (handoff).
		return mem.BufferSlice{hand((*buf)[:size], &handoff{pool: c.Pool, buf: buf})}, nil
	case proto.Message:
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return nil, fmt.Errorf("decode: cannot marshal %T", v)
}

// Unmarshal decodes data into v. For *Inbound it aliases data (see the
// package comment); other vtprotobuf messages are decoded with copies, and
// anything else through the protobuf runtime.
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *Inbound:
		return c.unmarshalInbound(data, m)
	case *Response:
		m.Release()
		buf, _ := c.hold(data)
		if err := m.Msg.UnmarshalVTUnsafe(buf.ReadOnlyData()); err != nil {
			m.Msg.ResetVT()
			buf.Free()
			return err
		}
		m.buf = buf
		return nil
	case vtMessage:
		buf := c.materialize(data)
		defer buf.Free()
		return m.UnmarshalVT(buf.ReadOnlyData())
	case proto.Message:
		buf := c.materialize(data)
		defer buf.Free()
		return proto.Unmarshal(buf.ReadOnlyData(), m)
	}
	return fmt.Errorf("decode: cannot unmarshal into %T", v)
}

// hold returns one buffer with data's bytes and a reference the caller
// owns: the frame buffer itself when the message arrived in one frame,
// otherwise one pooled copy (materialized true).
func (c Codec) hold(data mem.BufferSlice) (buf mem.Buffer, materialized bool) {
	if len(data) == 1 {
		data[0].Ref()
		return data[0], false
	}
	return c.materialize(data), true
}

// materialize copies data into one buffer the caller frees. gRPC's
// MaterializeToBuffer takes a pooled buffer for any size but never returns
// one below its pooling threshold (1 KiB) to the pool; such small messages
// get a plain slice instead.
func (c Codec) materialize(data mem.BufferSlice) mem.Buffer {
	if mem.IsBelowBufferPoolingThreshold(data.Len()) {
		return mem.SliceBuffer(data.Materialize())
	}
	return data.MaterializeToBuffer(c.Pool)
}

func (c Codec) unmarshalInbound(data mem.BufferSlice, in *Inbound) error {
	in.Release()
	in.DecodeStart = time.Now()
	defer func() { in.DecodeEnd = time.Now() }()
	var buf mem.Buffer
	buf, in.materialized = c.hold(data)
	if in.Msg == nil {
		in.Msg = &shardv1.SessionRequest{}
	}
	if b := buf.ReadOnlyData(); len(b) > 0 && b[0] == decodeTag && in.spare != nil {
		in.Msg.Kind, in.spare = in.spare, nil
	}
	if err := in.Msg.UnmarshalVTUnsafe(buf.ReadOnlyData()); err != nil {
		in.Msg.ResetVT()
		buf.Free()
		return err
	}
	in.buf = buf
	return nil
}
