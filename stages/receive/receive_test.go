package receive

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/bufpool/bufpooltest"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/sharderr"
	"github.com/meshnet/shardd/stages"
	"github.com/meshnet/shardd/stages/checksum"
	"github.com/meshnet/shardd/stages/decompress"
	"github.com/meshnet/shardd/stages/dtype"
	"github.com/meshnet/shardd/stages/frameout"
	"github.com/meshnet/shardd/stages/reassemble"
)

const budget = 1 << 20

func newPipeline(t testing.TB, pool *bufpool.Pool) *Pipeline {
	p := New(Config{Budget: reassemble.Budget{MaxTensorBytes: budget}, Checksum: checksum.Policy{Require: true}}, pool)
	t.Cleanup(p.Close)
	return p
}

// framed returns a valid bf16 tensor of the given shape split into fragments
// of fragBytes, with its body.
func framed(t testing.TB, pool *bufpool.Pool, shape []int64, fragBytes int, zstdOK bool, compressible bool) (*shardv1.NamedTensor, []byte) {
	t.Helper()
	n := int64(2)
	for _, d := range shape {
		n *= d
	}
	body := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 7))
	for i := range body {
		if compressible {
			body[i] = byte(i / 512)
		} else {
			body[i] = byte(r.Uint32())
		}
	}
	f := frameout.New(pool)
	t.Cleanup(f.Close)
	nt := &shardv1.NamedTensor{}
	owned := f.Frame(nt, "hidden_states", shape, shardv1.DType_DTYPE_BFLOAT16, body, frameout.Options{AcceptZstd: zstdOK, FragmentBytes: fragBytes})
	if owned != nil {
		// Detach the fragments from the pooled buffer so the test owns them.
		for _, fr := range nt.Fragments {
			fr.Payload = bytes.Clone(fr.Payload)
		}
		owned.Release()
	}
	return nt, body
}

func zstdFrame(t testing.TB, b []byte, withSize bool) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	if withSize {
		return enc.EncodeAll(b, nil)
	}
	// A streamed frame carries no content size in its header.
	var out bytes.Buffer
	// A small window keeps the frame within the receiver's memory budget, so
	// the size checks, not the window check, decide.
	w, _ := zstd.NewWriter(&out, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithWindowSize(zstd.MinWindowSize))
	// Flushing before the end makes the encoder emit blocks before it knows
	// the total, so the frame header has no content size.
	w.Write(b[:len(b)/2])
	w.Flush()
	w.Write(b[len(b)/2:])
	w.Close()
	var hdr zstd.Header
	if err := hdr.Decode(out.Bytes()); err != nil || hdr.HasFCS {
		t.Fatalf("setup: frame header err=%v hasFCS=%v", err, hdr.HasFCS)
	}
	return out.Bytes()
}

// singleZstd rewrites nt to carry payload as one zstd fragment.
func singleZstd(nt *shardv1.NamedTensor, payload []byte) {
	nt.Compression = shardv1.Compression_COMPRESSION_ZSTD
	nt.Fragments = []*shardv1.TensorFragment{{FragmentCount: 1, Payload: payload}}
}

// TestMalformedBundles gives each malformed bundle its contract ErrorCode.
func TestMalformedBundles(t *testing.T) {
	const (
		corrupt   = shardv1.ErrorCode_ERROR_CODE_PAYLOAD_CORRUPT
		exhausted = shardv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED
	)
	tests := []struct {
		name   string
		mutate func(t *testing.T, nt *shardv1.NamedTensor, body []byte)
		zstdOK bool
		want   error
		code   shardv1.ErrorCode
	}{
		{"hole", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Fragments[1].ByteOffset += 2
		}, false, reassemble.ErrHole, corrupt},
		{"missing fragment", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Fragments = nt.Fragments[:2]
		}, false, reassemble.ErrHole, corrupt},
		{"overlap", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Fragments[2].ByteOffset -= 2
		}, false, reassemble.ErrOverlap, corrupt},
		{"duplicate index", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Fragments[2].FragmentIndex = 1
		}, false, reassemble.ErrDuplicateIndex, corrupt},
		{"inconsistent count", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Fragments[1].FragmentCount = 9
		}, false, reassemble.ErrCountInconsistent, corrupt},
		{"index past count", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Fragments[1].FragmentIndex = 7
		}, false, reassemble.ErrIndexOutOfRange, corrupt},
		{"offset past end", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			last := nt.Fragments[len(nt.Fragments)-1]
			last.Payload = append(bytes.Clone(last.Payload), 0, 0)
		}, false, reassemble.ErrPastEnd, corrupt},
		{"no fragments", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Fragments = nil
		}, false, reassemble.ErrNoFragments, corrupt},
		{"total_bytes over budget", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Shape = []int64{budget, 2}
			nt.TotalBytes = 4 * budget
		}, false, reassemble.ErrOverBudget, exhausted},
		{"shape over budget", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Shape = []int64{1 << 31, 1 << 31, 1 << 31}
		}, false, reassemble.ErrOverBudget, exhausted},
		{"size/shape mismatch", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Shape = []int64{3, 33}
		}, false, reassemble.ErrSizeMismatch, corrupt},
		{"negative dimension", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Shape = []int64{-3, 32}
		}, false, reassemble.ErrBadShape, corrupt},
		{"bad CRC", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Fragments[0].Payload = bytes.Clone(nt.Fragments[0].Payload)
			nt.Fragments[0].Payload[5] ^= 1
		}, false, checksum.ErrMismatch, corrupt},
		{"missing checksum", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Checksum = nil
		}, false, checksum.ErrMissing, corrupt},
		{"short CRC value", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Checksum.Value = nt.Checksum.Value[:3]
		}, false, checksum.ErrValueSize, corrupt},
		{"big-endian", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.ByteOrder = shardv1.ByteOrder_BYTE_ORDER_BIG_ENDIAN
		}, false, reassemble.ErrByteOrder, corrupt},
		{"unspecified byte order", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.ByteOrder = shardv1.ByteOrder_BYTE_ORDER_UNSPECIFIED
		}, false, reassemble.ErrByteOrder, corrupt},
		{"unspecified dtype", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Dtype = shardv1.DType_DTYPE_UNSPECIFIED
		}, false, reassemble.ErrDTypeUnspecified, corrupt},
		{"unknown compression", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			nt.Compression = 9
		}, false, reassemble.ErrCompression, corrupt},
		{"zstd bomb", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			// A tiny frame that expands to 64x total_bytes, header without size.
			singleZstd(nt, zstdFrame(t, make([]byte, 64*nt.TotalBytes), false))
		}, true, decompress.ErrFrame, corrupt},
		{"zstd size lie", func(t *testing.T, nt *shardv1.NamedTensor, _ []byte) {
			singleZstd(nt, zstdFrame(t, make([]byte, 64*nt.TotalBytes), true))
		}, true, decompress.ErrSize, corrupt},
		{"zstd short", func(t *testing.T, nt *shardv1.NamedTensor, body []byte) {
			singleZstd(nt, zstdFrame(t, body[:len(body)/2], false))
		}, true, decompress.ErrSize, corrupt},
		{"truncated zstd", func(t *testing.T, nt *shardv1.NamedTensor, body []byte) {
			f := zstdFrame(t, body, true)
			singleZstd(nt, f[:len(f)/2])
		}, true, decompress.ErrFrame, corrupt},
		{"compression not negotiated", func(t *testing.T, nt *shardv1.NamedTensor, body []byte) {
			singleZstd(nt, zstdFrame(t, body, true))
		}, false, decompress.ErrNotNegotiated, corrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := bufpooltest.New(t)
			p := newPipeline(t, pool)
			nt, body := framed(t, pool, []int64{4, 32}, 64, false, false)
			if len(nt.Fragments) != 4 {
				t.Fatalf("setup: %d fragments", len(nt.Fragments))
			}
			tt.mutate(t, nt, body)
			var tensor stages.Tensor
			err := p.Tensor(&tensor, nt, tt.zstdOK)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			se := sharderr.From(err)
			if se.Code != tt.code {
				t.Fatalf("code %v, want %v", se.Code, tt.code)
			}
			if se.Detail == "" || se.Retryable {
				t.Fatalf("detail %q retryable %v", se.Detail, se.Retryable)
			}
			if tensor.Len() != 0 {
				t.Fatal("failed tensor still holds a body")
			}
		})
	}
}

func TestChecksumOptionalByPolicy(t *testing.T) {
	pool := bufpooltest.New(t)
	p := New(Config{Budget: reassemble.Budget{MaxTensorBytes: budget}}, pool)
	defer p.Close()
	nt, body := framed(t, pool, []int64{2, 8}, 0, false, false)
	nt.Checksum = nil
	var tensor stages.Tensor
	if err := p.Tensor(&tensor, nt, false); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(tensor.Contiguous(pool), body) {
		t.Fatal("body differs")
	}
	tensor.Reset()
}

// TestRoundTripProperty: frame out -> reassemble -> decompress -> checksum
// returns the original bytes for random shapes, dtypes, fragment sizes and
// compression choices.
func TestRoundTripProperty(t *testing.T) {
	pool := bufpooltest.New(t)
	p := newPipeline(t, pool)
	f := frameout.New(pool)
	defer f.Close()
	r := rand.New(rand.NewPCG(11, 13))
	dtypes := []shardv1.DType{
		shardv1.DType_DTYPE_BFLOAT16, shardv1.DType_DTYPE_FLOAT16, shardv1.DType_DTYPE_FLOAT32,
		shardv1.DType_DTYPE_INT32, shardv1.DType_DTYPE_INT64, shardv1.DType_DTYPE_UINT8,
		shardv1.DType_DTYPE_INT8, shardv1.DType_DTYPE_BOOL,
	}
	compressed := 0
	for i := range 500 {
		dt := dtypes[r.IntN(len(dtypes))]
		shape := make([]int64, 1+r.IntN(3))
		n := int64(dtype.Size(dt))
		for j := range shape {
			shape[j] = int64(r.IntN(40))
			if r.IntN(10) == 0 {
				shape[j] = int64(r.IntN(3000))
			}
			n *= shape[j]
		}
		if n > budget {
			continue
		}
		body := make([]byte, n)
		if r.IntN(2) == 0 {
			for k := range body {
				body[k] = byte(r.Uint32())
			}
		} else {
			for k := range body {
				body[k] = byte(k / 97)
			}
		}
		zstdOK := r.IntN(2) == 0
		frag := 1 + r.IntN(int(max(n, 1)))
		var nt shardv1.NamedTensor
		owned := f.Frame(&nt, "t", shape, dt, body, frameout.Options{AcceptZstd: zstdOK, FragmentBytes: frag})
		if nt.Compression == shardv1.Compression_COMPRESSION_ZSTD {
			compressed++
		}
		// Cross the wire for real: marshal and unmarshal.
		wire, err := nt.MarshalVT()
		if err != nil {
			t.Fatal(err)
		}
		if owned != nil {
			owned.Release()
		}
		var got shardv1.NamedTensor
		if err := got.UnmarshalVTUnsafe(wire); err != nil {
			t.Fatal(err)
		}
		var tensor stages.Tensor
		if err := p.Tensor(&tensor, &got, zstdOK); err != nil {
			t.Fatalf("case %d (%v %v frag %d zstd %v): %v", i, dt, shape, frag, zstdOK, err)
		}
		if !bytes.Equal(tensor.Contiguous(pool), body) {
			t.Fatalf("case %d: body differs", i)
		}
		tensor.Reset()
	}
	if compressed == 0 {
		t.Fatal("no case exercised compression")
	}
}

// FuzzReceive feeds arbitrary NamedTensor encodings through reassemble,
// decompress and checksum. It must never panic, never leak a pooled buffer,
// and anything it accepts must be exactly total_bytes long and carry a CRC
// that matches.
func FuzzReceive(f *testing.F) {
	pool := bufpool.New()
	fr := frameout.New(pool)
	for _, c := range []struct {
		frag  int
		zstd  bool
		large bool
	}{{0, false, false}, {7, false, false}, {3, true, true}, {0, true, true}} {
		body := make([]byte, 2*64)
		if c.large {
			body = make([]byte, 2*4096)
		}
		for i := range body {
			body[i] = byte(i / 64)
		}
		var nt shardv1.NamedTensor
		owned := fr.Frame(&nt, "hidden_states", []int64{1, int64(len(body) / 2)}, shardv1.DType_DTYPE_BFLOAT16, body,
			frameout.Options{AcceptZstd: c.zstd, FragmentBytes: c.frag})
		wire, _ := nt.MarshalVT()
		if owned != nil {
			owned.Release()
		}
		f.Add(wire, c.zstd)
	}
	fr.Close()
	f.Fuzz(func(t *testing.T, wire []byte, zstdOK bool) {
		pool := bufpooltest.New(t)
		p := New(Config{Budget: reassemble.Budget{MaxTensorBytes: 1 << 16}}, pool)
		defer p.Close()
		var nt shardv1.NamedTensor
		if err := nt.UnmarshalVTUnsafe(wire); err != nil {
			return
		}
		var tensor stages.Tensor
		if err := p.Tensor(&tensor, &nt, zstdOK); err != nil {
			if sharderr.Code(err) == shardv1.ErrorCode_ERROR_CODE_INTERNAL {
				t.Fatalf("unclassified error: %v", err)
			}
			return
		}
		defer tensor.Reset()
		if uint64(tensor.Len()) != nt.TotalBytes {
			t.Fatalf("accepted %d bytes for total_bytes %d", tensor.Len(), nt.TotalBytes)
		}
		if nt.Checksum.GetAlgorithm() == shardv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C &&
			checksum.CRC32C(tensor.Segments()) != binary.BigEndian.Uint32(nt.Checksum.Value) {
			t.Fatal("accepted a body whose CRC does not match")
		}
	})
}
