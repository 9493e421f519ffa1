package frames

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"

	"github.com/meshnet/shardd/stages/decode"
)

// Preface opens every connection, from the initiator.
const Preface = "SHARDDF1"

// Frame types.
const (
	typeSessionRequest  byte = 0x01
	typeSessionResponse byte = 0x02
	typeCloseSend       byte = 0x03 // the initiator sends no more (empty)
	typeEnd             byte = 0x04 // the exchange ended: google.rpc.Status, empty for OK

	typeCapabilityRequest byte = 0x10
	typeCapabilityReport  byte = 0x11
	typeHealthRequest     byte = 0x12
	typeHealthReport      byte = 0x13
	typeReleaseRequest    byte = 0x14
	typeReleaseResponse   byte = 0x15
	typeCancelRequest     byte = 0x16
	typeCancelResponse    byte = 0x17
	typeUnaryError        byte = 0x1f // google.rpc.Status
)

const headerLen = 5

// Errors a caller can classify.
var (
	ErrPreface   = errors.New("frames: not a shardd frame connection")
	ErrFrameSize = errors.New("frames: frame exceeds the size limit")
	ErrProtocol  = errors.New("frames: unexpected frame")
)

// conn is one framed connection: one goroutine reads, any number write
// (whole frames, under wmu).
type conn struct {
	nc    net.Conn
	r     *bufio.Reader
	one   [1]mem.Buffer // readMsg's BufferSlice (the reader's own)
	codec encoding.CodecV2
	pool  mem.BufferPool
	// maxRecv bounds a received payload; a larger one is refused before
	// any of it is read.
	maxRecv int
	// writeTimeout bounds one frame's write (0: none): a peer that stops
	// reading for that long is cut off instead of holding a writer forever.
	writeTimeout time.Duration

	wmu     sync.Mutex // guards the fields below and writes to nc
	preface bool       // the initiator's preface goes out with the next frame
	hdr     [headerLen]byte
	vec     net.Buffers // the array of the frame's segments, kept
	out     net.Buffers // what WriteTo consumes: a field, so it does not escape per frame
	small   []byte      // writeMsg's buffer for small messages
}

func newConn(nc net.Conn, codec encoding.CodecV2, pool mem.BufferPool, maxRecv int, writeTimeout time.Duration) *conn {
	return &conn{nc: nc, r: bufio.NewReaderSize(nc, 32<<10), codec: codec, pool: pool, maxRecv: maxRecv, writeTimeout: writeTimeout}
}

// writeFrame writes one frame whose payload is data (not freed here).
func (c *conn) writeFrame(typ byte, data mem.BufferSlice) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(typ, data, nil)
}

// writeLocked writes one frame whose payload is data's buffers followed by
// raw; c.wmu is held.
func (c *conn) writeLocked(typ byte, data mem.BufferSlice, raw []byte) error {
	n := data.Len() + len(raw)
	if n > 1<<31-1 {
		return ErrFrameSize
	}
	c.hdr[0] = typ
	binary.BigEndian.PutUint32(c.hdr[1:], uint32(n))
	v := c.vec[:0]
	if c.preface {
		v, c.preface = append(v, []byte(Preface)), false
	}
	v = append(v, c.hdr[:])
	for _, b := range data {
		v = append(v, b.ReadOnlyData())
	}
	if len(raw) > 0 {
		v = append(v, raw)
	}
	c.vec, c.out = v[:0], v
	if c.writeTimeout > 0 {
		c.nc.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	// On a TCP connection one writev for the header and every segment.
	_, err := c.out.WriteTo(c.nc)
	c.out = nil
	clear(c.vec[:cap(c.vec)])
	return err
}

// sizedMarshaler is a message that marshals into a caller's buffer (the
// generated vtproto code).
type sizedMarshaler interface {
	SizeVT() int
	MarshalToSizedBufferVT([]byte) (int, error)
}

// smallMsg is the largest message writeMsg marshals into the connection's
// own buffer (an Ack, a status, a small step or result); larger ones go
// through the codec, whose buffers are pooled or reference a result's
// payload itself.
const smallMsg = 4 << 10

// writeMsg marshals m and writes it as one frame: a small message into the
// connection's own buffer, anything else with the codec. The first is only
// taken when the codec writes the protobuf wire format (its name is
// "proto"), which is what vtproto writes. A small Spliced result has no
// payload worth splicing (decode.MinSplice is larger), and its message
// marshals to the same bytes.
func (c *conn) writeMsg(typ byte, m any) error {
	sm, ok := m.(sizedMarshaler)
	if sp, isSpliced := m.(*decode.Spliced); isSpliced {
		sm, ok = sp.Msg, true
	}
	if ok && c.codec.Name() == "proto" {
		if n := sm.SizeVT(); n <= smallMsg {
			c.wmu.Lock()
			defer c.wmu.Unlock()
			if c.small == nil {
				c.small = make([]byte, smallMsg)
			}
			b := c.small[:n]
			if _, err := sm.MarshalToSizedBufferVT(b); err != nil {
				return err
			}
			return c.writeLocked(typ, nil, b)
		}
	}
	data, err := c.codec.Marshal(m)
	if err != nil {
		return err
	}
	defer data.Free()
	return c.writeFrame(typ, data)
}

// readHeader reads the next frame's type and payload length.
func (c *conn) readHeader() (byte, int, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return 0, 0, err
	}
	n := int(binary.BigEndian.Uint32(h[1:]))
	if n > c.maxRecv {
		return h[0], n, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameSize, n, c.maxRecv)
	}
	return h[0], n, nil
}

// readPayload reads n bytes into one pooled buffer the caller frees.
func (c *conn) readPayload(n int) (mem.Buffer, error) {
	if n == 0 {
		return mem.SliceBuffer(nil), nil
	}
	if mem.IsBelowBufferPoolingThreshold(n) {
		b := make([]byte, n)
		if _, err := io.ReadFull(c.r, b); err != nil {
			return nil, err
		}
		return mem.SliceBuffer(b), nil
	}
	p := c.pool.Get(n)
	if _, err := io.ReadFull(c.r, (*p)[:n]); err != nil {
		c.pool.Put(p)
		return nil, err
	}
	return mem.NewBuffer(p, c.pool), nil
}

// readMsg reads a payload of n bytes and decodes it into m with the codec,
// which takes its own reference where m aliases the buffer.
func (c *conn) readMsg(n int, m any) error {
	buf, err := c.readPayload(n)
	if err != nil {
		return err
	}
	defer buf.Free()
	// One reader per connection: the slice's array is the conn's, not a
	// new one per message.
	c.one[0] = buf
	err = c.codec.Unmarshal(c.one[:], m)
	c.one[0] = nil
	return err
}

// discard skips a payload of n bytes.
func (c *conn) discard(n int) error {
	_, err := c.r.Discard(n)
	return err
}
