package stages

import (
	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// Tensor is one validated named tensor on its way through the receive stages.
//
// A Tensor is reused across messages by its owner (one per stream side) so
// the hot path does not allocate; Reset clears it and releases what it owns.
type Tensor struct {
	// Name aliases the received message. Clone it if it must outlive the
	// message.
	Name        string
	Shape       []int64 // aliases the received message
	DType       shardv1.DType
	Compression shardv1.Compression
	// TotalBytes is the uncompressed size, checked against Shape and DType.
	TotalBytes uint64
	Checksum   *shardv1.Checksum // aliases the received message; may be nil

	// segs are the body's pieces in offset order: the wire (possibly
	// compressed) body after reassembly, the uncompressed body after
	// decompression. They alias the message unless owned is set.
	segs  [][]byte
	owned *bufpool.Buffer
}

// Segments returns the body's pieces in order. They are read-only and valid
// until Reset or until the received message is released.
func (t *Tensor) Segments() [][]byte { return t.segs }

// Len returns the body's length in bytes.
func (t *Tensor) Len() int {
	n := 0
	for _, s := range t.segs {
		n += len(s)
	}
	return n
}

// SetSegments replaces the body. The Tensor takes ownership of owned (which
// may be nil) and releases any buffer it held before.
func (t *Tensor) SetSegments(segs [][]byte, owned *bufpool.Buffer) {
	if t.owned != nil && t.owned != owned {
		t.owned.Release()
	}
	t.segs, t.owned = segs, owned
}

// SetBody replaces the body with a single owned buffer holding b.
func (t *Tensor) SetBody(b []byte, owned *bufpool.Buffer) {
	t.SetSegments(append(t.segs[:0], b), owned)
}

// ResizeSegments returns t's segment slice resized to n entries, reusing its
// storage, for a stage to fill in.
func (t *Tensor) ResizeSegments(n int) [][]byte {
	if cap(t.segs) < n {
		t.segs = make([][]byte, n)
	}
	t.segs = t.segs[:n]
	clear(t.segs)
	return t.segs
}

// Contiguous returns the body as one slice: the single segment itself, or a
// copy of all segments into a buffer from pool that the Tensor then owns.
// The result is read-only and valid until Reset.
func (t *Tensor) Contiguous(pool *bufpool.Pool) []byte {
	switch len(t.segs) {
	case 0:
		return nil
	case 1:
		return t.segs[0]
	}
	buf := pool.Alloc(t.Len())
	b := buf.Bytes()
	off := 0
	for _, s := range t.segs {
		off += copy(b[off:], s)
	}
	t.SetBody(b, buf)
	return b
}

// Reset releases what the Tensor owns and clears it for reuse.
func (t *Tensor) Reset() {
	if t.owned != nil {
		t.owned.Release()
	}
	clear(t.segs)
	*t = Tensor{segs: t.segs[:0]}
}
