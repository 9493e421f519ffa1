// Package frameout turns an outgoing tensor into its wire form: checksum over
// the uncompressed bytes, zstd only when the peer accepts it and it pays, and
// fragments of a bounded size whose offsets tile the wire body.
//
// bf16 activations are close to incompressible (zstd's fastest level measured
// a ratio of 1.00 on normal-distributed bf16), so the compression decision
// first compresses a sample and gives up early when the sample does not
// shrink; the whole body is compressed only when the sample promises a gain.
package frameout

import (
	"math"

	"github.com/klauspost/compress/zstd"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/wireerr"
	"github.com/meshnet/shardd/stages/checksum"
)

// ErrChunkTooLarge reports a message that would exceed max_chunk_bytes.
var ErrChunkTooLarge = wireerr.New(shardv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED,
	"frameout: message exceeds max_chunk_bytes")

const (
	sampleBytes = 64 << 10
	// minCompressBytes: below this, a zstd frame header is not worth it.
	minCompressBytes = 4 << 10
	// worthRatio: compressed/uncompressed must be at most this to send zstd.
	worthRatio = 0.90
)

// DefaultFragmentBytes is the fragment size when Options leaves it zero.
const DefaultFragmentBytes = 1 << 20

// Options control one tensor's framing.
type Options struct {
	// AcceptZstd is true when the peer negotiated zstd.
	AcceptZstd bool
	// FragmentBytes bounds each fragment's payload; 0 means
	// DefaultFragmentBytes.
	FragmentBytes int
}

// Framer frames tensors. It is safe for concurrent use.
type Framer struct {
	enc  *zstd.Encoder
	pool *bufpool.Pool
}

// New returns a Framer that takes compression buffers from pool.
func New(pool *bufpool.Pool) *Framer {
	enc, err := zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderConcurrency(1),
		zstd.WithZeroFrames(true),
	)
	if err != nil {
		panic("frameout: static zstd options rejected: " + err.Error())
	}
	return &Framer{enc: enc, pool: pool}
}

// Close releases the encoder.
func (f *Framer) Close() { f.enc.Close() }

// Frame fills nt (whose previous contents are overwritten, reusing its
// fragment storage) to carry body with the given name, shape and dtype.
//
// The fragments alias body, or a pooled buffer holding the compressed body
// that Frame returns: the caller owns it and releases it once nt has been
// marshaled. body must stay unchanged until then. When compression does not
// pay, the returned buffer is nil.
func (f *Framer) Frame(nt *shardv1.NamedTensor, name string, shape []int64, dt shardv1.DType, body []byte, o Options) *bufpool.Buffer {
	nt.Name = name
	nt.Shape = append(nt.Shape[:0], shape...)
	nt.Dtype = dt
	nt.ByteOrder = shardv1.ByteOrder_BYTE_ORDER_LITTLE_ENDIAN
	nt.TotalBytes = uint64(len(body))
	if nt.Checksum == nil {
		nt.Checksum = &shardv1.Checksum{}
	}
	checksum.Fill(nt.Checksum, body)

	wire, owned := body, (*bufpool.Buffer)(nil)
	nt.Compression = shardv1.Compression_COMPRESSION_NONE
	if o.AcceptZstd && f.pays(body) {
		if buf, ok := f.compress(body); ok {
			wire, owned = buf.Bytes(), buf
			nt.Compression = shardv1.Compression_COMPRESSION_ZSTD
		}
	}
	fragment(nt, wire, o.FragmentBytes)
	return owned
}

// pays compresses a sample of body and reports whether it shrank enough.
func (f *Framer) pays(body []byte) bool {
	if len(body) < minCompressBytes {
		return false
	}
	sample := body[:min(len(body), sampleBytes)]
	var scratch [sampleBytes + 1024]byte
	out := f.enc.EncodeAll(sample, scratch[:0])
	return float64(len(out)) <= worthRatio*float64(len(sample))
}

// compress returns body compressed into a pooled buffer, or false when the
// whole body did not compress well enough after all.
func (f *Framer) compress(body []byte) (*bufpool.Buffer, bool) {
	limit := int(math.Floor(worthRatio * float64(len(body))))
	buf := f.pool.Alloc(f.enc.MaxEncodedSize(len(body)))
	out := f.enc.EncodeAll(body, buf.Bytes()[:0])
	if len(out) > limit || &out[0] != &buf.Bytes()[0] {
		buf.Release()
		return nil, false
	}
	buf.SetLen(len(out))
	return buf, true
}

// fragment splits wire into fragments of at most size bytes (one empty
// fragment for an empty body), reusing nt's fragment structs.
func fragment(nt *shardv1.NamedTensor, wire []byte, size int) {
	if size <= 0 {
		size = DefaultFragmentBytes
	}
	n := max(1, (len(wire)+size-1)/size)
	frags := nt.Fragments[:cap(nt.Fragments)]
	for len(frags) < n {
		frags = append(frags, nil)
	}
	frags = frags[:n]
	for i := range frags {
		if frags[i] == nil {
			frags[i] = &shardv1.TensorFragment{}
		}
		lo := i * size
		hi := min(len(wire), lo+size)
		fr := frags[i]
		fr.FragmentIndex, fr.FragmentCount = uint32(i), uint32(n)
		fr.ByteOffset = uint64(lo)
		fr.Payload = wire[lo:hi:hi]
	}
	nt.Fragments = frags
}

// CheckChunk refuses a message whose serialized size exceeds maxChunkBytes
// (0 means unlimited).
func CheckChunk(size int, maxChunkBytes uint64) error {
	if maxChunkBytes != 0 && uint64(size) > maxChunkBytes {
		return wireerr.Errorf(ErrChunkTooLarge, "%d bytes over a limit of %d", size, maxChunkBytes)
	}
	return nil
}
