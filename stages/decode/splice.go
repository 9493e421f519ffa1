package decode

import (
	"runtime"
	"sync/atomic"
	"unsafe"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// MinSplice is the smallest fragment payload that Marshal of a Spliced
// references instead of copying. Below it a reference costs more than the
// copy it saves.
const MinSplice = 16 << 10

// Spliced is a SessionResponse to send whose large fragment payloads lie in
// Body (a worker's result buffer). Marshal writes the message around those
// payloads and hands gRPC the payloads themselves, holding a reference on
// Body until gRPC has written them, instead of copying every byte into a
// marshal buffer: for a last hop that is 4 x vocab bytes per token. The wire
// bytes are the same as the message's MarshalVT. Payloads outside Body (a
// compressed frame) and small ones are copied as usual. Marshal sets a
// tensor's fragments and a fragment's payload aside while it encodes their
// other fields and puts them back: nothing may read Msg meanwhile (the
// worker's send goroutine owns it).
type Spliced struct {
	Msg  *shardv1.SessionResponse
	Body *bufpool.Buffer
}

// handoff is the mem.BufferPool of one pooled buffer handed to gRPC: a
// spliced payload, which holds a reference on its result buffer (body), or
// a marshal buffer from pool (buf). gRPC "returns" it when it has written
// it, which gives the buffer back.
//
// gRPC may never return it. grpc-go v1.85 drops a data frame without
// freeing it in two places (internal/transport/controlbuf.go):
//   - its writer, when it exits on a connection error, frees only what is
//     still in the control buffer, not the frames queued on its streams;
//   - preprocessData drops a frame for a stream the writer has already
//     cleaned up (the client reset it while the frame was being queued).
//
// The buffer would then count as outstanding for ever (the soak saw one
// marshal buffer or 1-2 result buffers out after resets and cancels). So
// the slice header gRPC holds also has a cleanup: once gRPC's buffer is
// unreachable (nothing can read the bytes any more), a buffer gRPC never
// returned is given back then. That takes a GC, and on an idle process up
// to two: gRPC's list nodes go back to a sync.Pool still holding their
// last item (itemList.dequeue), which the second GC after frees.
type handoff struct {
	body *bufpool.Buffer // a spliced payload's result buffer, or
	pool mem.BufferPool  // the pool of a marshal buffer,
	buf  *[]byte         // and the buffer as pool gave it
	done atomic.Bool     // given back (by Put or by the cleanup)
}

func (h *handoff) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (h *handoff) Put(*[]byte)       { h.giveBack() }

func (h *handoff) giveBack() {
	if !h.done.CompareAndSwap(false, true) {
		return
	}
	if h.body != nil {
		h.body.Release()
	} else {
		h.pool.Put(h.buf)
	}
}

// hand gives gRPC p, which h gives back when gRPC returns it or drops it
// unreturned (see handoff).
func hand(p []byte, h *handoff) mem.Buffer {
	held := p
	runtime.AddCleanup(&held, (*handoff).giveBack, h)
	return mem.NewBuffer(&held, h)
}

// splicedBuffer hands gRPC payload p of body, holding a reference on body
// until gRPC returns it or drops it unreturned.
func splicedBuffer(p []byte, body *bufpool.Buffer) mem.Buffer {
	body.Ref()
	return hand(p, &handoff{body: body})
}

// splicedSizes are the encoded sizes of a chunk's nested messages.
type splicedSizes struct {
	env, bundle, chunk int
	tensors            []int // each tensor's size
	frags              []int // each fragment's size, tensor by tensor
}

// marshalSpliced encodes sp field by field in MarshalVT's order: what lies
// around the spliced payloads goes into one buffer, cut into the segments
// between them.
func (c Codec) marshalSpliced(sp *Spliced) (mem.BufferSlice, error) {
	chunk := sp.Msg.GetChunk()
	if chunk == nil || sp.Body == nil || !worthSplicing(sp) {
		return c.Marshal(sp.Msg)
	}
	body := sp.Body.Bytes()
	sz, spliced := sizesOf(chunk, body)
	total := sizeOfField(sz.chunk)

	seg := make([]byte, 0, total-spliced)
	var out mem.BufferSlice
	start := 0
	seg = appendField(seg, 2, sz.chunk) // SessionResponse.chunk
	if env := chunk.Envelope; env != nil {
		seg = appendField(seg, 1, sz.env)
		seg = appendVT(seg, env)
	}
	if bundle := chunk.Bundle; bundle != nil {
		seg = appendField(seg, 2, sz.bundle)
		if v := bundle.BundleVersion; v != 0 {
			seg = protowire.AppendTag(seg, 1, protowire.VarintType)
			seg = protowire.AppendVarint(seg, uint64(v))
		}
		fi := 0
		for ti, nt := range bundle.Tensors {
			seg = appendField(seg, 2, sz.tensors[ti])
			frags := nt.Fragments
			nt.Fragments = nil
			seg = appendVT(seg, nt)
			nt.Fragments = frags
			for _, f := range frags {
				seg = appendField(seg, 8, sz.frags[fi])
				fi++
				p := f.Payload
				f.Payload = nil
				seg = appendVT(seg, f)
				f.Payload = p
				if len(p) == 0 {
					continue
				}
				seg = appendField(seg, 4, len(p))
				if !spliceable(p, body) {
					seg = append(seg, p...)
					continue
				}
				out = append(out, mem.SliceBuffer(seg[start:len(seg):len(seg)]))
				start = len(seg)
				out = append(out, splicedBuffer(p, sp.Body))
			}
		}
	}
	if start < len(seg) {
		out = append(out, mem.SliceBuffer(seg[start:]))
	}
	return out, nil
}

// worthSplicing reports whether sp has a payload to splice and nothing the
// field-by-field encoder would drop (unknown fields).
func worthSplicing(sp *Spliced) bool {
	chunk := sp.Msg.GetChunk()
	if len(sp.Msg.ProtoReflect().GetUnknown()) > 0 || len(chunk.ProtoReflect().GetUnknown()) > 0 ||
		len(chunk.GetBundle().ProtoReflect().GetUnknown()) > 0 {
		return false
	}
	body := sp.Body.Bytes()
	for _, nt := range chunk.GetBundle().GetTensors() {
		for _, f := range nt.Fragments {
			if spliceable(f.Payload, body) {
				return true
			}
		}
	}
	return false
}

// spliceable: p is large and lies within body. (gRPC never returns a
// buffer below its pooling threshold, which would keep Body's reference.)
func spliceable(p, body []byte) bool {
	return len(p) >= MinSplice && !mem.IsBelowBufferPoolingThreshold(len(p)) && within(p, body)
}

// within reports whether inner's bytes lie inside outer's.
func within(inner, outer []byte) bool {
	if len(inner) == 0 || len(outer) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&outer[0]))
	p := uintptr(unsafe.Pointer(&inner[0]))
	return p >= lo && p+uintptr(len(inner)) <= lo+uintptr(len(outer))
}

// sizesOf computes the encoded sizes bottom-up and the number of payload
// bytes that will be spliced rather than written.
func sizesOf(chunk *shardv1.ActivationChunk, body []byte) (sz splicedSizes, spliced int) {
	if env := chunk.Envelope; env != nil {
		sz.env = env.SizeVT()
		sz.chunk += sizeOfField(sz.env)
	}
	bundle := chunk.Bundle
	if bundle == nil {
		return sz, 0
	}
	if v := bundle.BundleVersion; v != 0 {
		sz.bundle += protowire.SizeTag(1) + protowire.SizeVarint(uint64(v))
	}
	for _, nt := range bundle.Tensors {
		frags := nt.Fragments
		nt.Fragments = nil
		ts := nt.SizeVT()
		nt.Fragments = frags
		for _, f := range frags {
			p := f.Payload
			f.Payload = nil
			fs := f.SizeVT()
			f.Payload = p
			if len(p) > 0 {
				fs += sizeOfField(len(p))
				if spliceable(p, body) {
					spliced += len(p)
				}
			}
			sz.frags = append(sz.frags, fs)
			ts += sizeOfField(fs)
		}
		sz.tensors = append(sz.tensors, ts)
		sz.bundle += sizeOfField(ts)
	}
	sz.chunk += sizeOfField(sz.bundle)
	return sz, spliced
}

// sizeOfField is the encoded size of a length-delimited field (numbers below
// 16: a one-byte tag) whose value is n bytes.
func sizeOfField(n int) int { return 1 + protowire.SizeVarint(uint64(n)) + n }

// appendField appends the tag and length of length-delimited field num.
func appendField(b []byte, num protowire.Number, n int) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(n))
}

// appendVT appends m's encoding within b's capacity.
func appendVT(b []byte, m vtMessage) []byte {
	n := m.SizeVT()
	b = b[:len(b)+n]
	m.MarshalToSizedBufferVT(b[len(b)-n:])
	return b
}
