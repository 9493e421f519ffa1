package dtype

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/x448/float16"
)

func TestBF16RoundTripExact(t *testing.T) {
	// Every bf16 value widens and narrows back to itself (NaNs stay NaN).
	src := make([]byte, 2*65536)
	for i := range 65536 {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
	}
	f := AppendBF16ToF32(nil, src)
	back := AppendF32ToBF16(nil, f)
	for i := range 65536 {
		got := binary.LittleEndian.Uint16(back[2*i:])
		want := uint16(i)
		if isBF16NaN(want) {
			if !isBF16NaN(got) {
				t.Fatalf("NaN %#04x came back as %#04x", want, got)
			}
			continue
		}
		if got != want {
			t.Fatalf("%#04x came back as %#04x", want, got)
		}
	}
}

func isBF16NaN(h uint16) bool { return h&0x7F80 == 0x7F80 && h&0x7F != 0 }

func TestBF16ConversionMatchesScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 3, 4, 5, 7, 8, 9, 4096, 4099} {
		src := make([]byte, 2*n)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		prefix := []float32{42}
		got := AppendBF16ToF32(prefix, src)
		if len(got) != n+1 || got[0] != 42 {
			t.Fatalf("n=%d: prefix or length wrong", n)
		}
		for i := range n {
			want := math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
			if math.Float32bits(got[i+1]) != math.Float32bits(want) {
				t.Fatalf("n=%d i=%d: got %v want %v", n, i, got[i+1], want)
			}
		}
	}
}

func TestF32ToBF16Rounding(t *testing.T) {
	tests := []struct {
		in   uint32
		want uint16
	}{
		{0x3F800000, 0x3F80}, // 1.0
		{0x3F808000, 0x3F80}, // tie, even stays
		{0x3F818000, 0x3F82}, // tie, odd rounds up
		{0x3F808001, 0x3F81}, // above tie
		{0x7F7FFFFF, 0x7F80}, // max float rounds to inf
		{0xFF800000, 0xFF80}, // -inf
	}
	for _, tt := range tests {
		if got := F32ToBF16(math.Float32frombits(tt.in)); got != tt.want {
			t.Errorf("F32ToBF16(%#08x) = %#04x, want %#04x", tt.in, got, tt.want)
		}
	}
	if !isBF16NaN(F32ToBF16(float32(math.NaN()))) {
		t.Error("NaN lost")
	}
}

// The half-float conversions are checked against x448/float16 over every
// half value and a sweep of float32 values.
func TestF16AgainstReference(t *testing.T) {
	for i := range 65536 {
		h := uint16(i)
		got := F16ToF32(h)
		want := float16.Frombits(h).Float32()
		if math.IsNaN(float64(want)) {
			if !math.IsNaN(float64(got)) {
				t.Fatalf("%#04x: NaN lost", h)
			}
			continue
		}
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("F16ToF32(%#04x) = %v, want %v", h, got, want)
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 1_000_000 {
		f := math.Float32frombits(r.Uint32())
		if math.IsNaN(float64(f)) {
			continue
		}
		if got, want := F32ToF16(f), float16.Fromfloat32(f).Bits(); got != want {
			t.Fatalf("F32ToF16(%v [%#08x]) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
}

func TestF32BytesRoundTrip(t *testing.T) {
	in := []float32{0, -1.5, 3.25e-20, float32(math.Inf(1))}
	out := AppendF32FromBytes(nil, AppendF32Bytes(nil, in))
	for i := range in {
		if out[i] != in[i] {
			t.Fatalf("%d: %v != %v", i, out[i], in[i])
		}
	}
	h := AppendF16ToF32(nil, AppendF32ToF16(nil, []float32{0.5, -2}))
	if h[0] != 0.5 || h[1] != -2 {
		t.Fatalf("f16 round trip: %v", h)
	}
}

// TestF32BytesLittleEndian checks the bulk copies against the wire's
// explicit little-endian encoding, bit for bit (NaN payloads included), with
// offsets that leave the byte side unaligned and a trailing partial element.
func TestF32BytesLittleEndian(t *testing.T) {
	in := make([]float32, 1027)
	for i := range in {
		in[i] = math.Float32frombits(uint32(i)*2654435761 ^ 0x7fc00001)
	}
	in[3] = float32(math.Inf(-1))
	prefix := []byte{9, 9, 9}
	got := AppendF32Bytes(append([]byte(nil), prefix...), in)
	want := append([]byte(nil), prefix...)
	for _, f := range in {
		want = binary.LittleEndian.AppendUint32(want, math.Float32bits(f))
	}
	if string(got) != string(want) {
		t.Fatal("AppendF32Bytes differs from the little-endian encoding")
	}
	back := AppendF32FromBytes([]float32{7}, append(got[len(prefix):], 1, 2))
	if len(back) != 1+len(in) || back[0] != 7 {
		t.Fatalf("AppendF32FromBytes kept %d values, want %d", len(back), 1+len(in))
	}
	for i, f := range in {
		if math.Float32bits(back[1+i]) != math.Float32bits(f) {
			t.Fatalf("%d: %#08x, want %#08x", i, math.Float32bits(back[1+i]), math.Float32bits(f))
		}
	}
}

// plainBF16ToF32 is the per-element loop the fast path is measured against.
func plainBF16ToF32(dst []float32, src []byte) []float32 {
	for i := 0; i+1 < len(src); i += 2 {
		dst = append(dst, math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[i:]))<<16))
	}
	return dst
}

// BenchmarkBF16ToF32 compares the fast conversion with a plain loop in the
// same run; PERF.md quotes the ratio of their medians.
func BenchmarkBF16ToF32(b *testing.B) {
	const n = 4096 * 64
	src := make([]byte, 2*n)
	for i := range src {
		src[i] = byte(i * 7)
	}
	dst := make([]float32, 0, n)
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			dst = AppendBF16ToF32(dst[:0], src)
		}
	})
	b.Run("plain", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(src)))
		for b.Loop() {
			dst = plainBF16ToF32(dst[:0], src)
		}
	})
}
