// Package dtype converts boundary tensors between their wire element types
// and the float32 the backend computes in.
//
// Every function appends into a caller's dst and returns it, so the hot path
// reuses buffers and allocates nothing. Wire bytes are little-endian, as the
// contract makes canonical. bf16 -> f32 is exact; f32 -> bf16 rounds to
// nearest even and keeps NaN a NaN.
package dtype

import (
	"encoding/binary"
	"math"
	"slices"
	"unsafe"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// Size returns the element size in bytes of d, or 0 for an unspecified or
// unknown dtype.
func Size(d shardv1.DType) int {
	switch d {
	case shardv1.DType_DTYPE_BFLOAT16, shardv1.DType_DTYPE_FLOAT16:
		return 2
	case shardv1.DType_DTYPE_FLOAT32, shardv1.DType_DTYPE_INT32:
		return 4
	case shardv1.DType_DTYPE_INT64:
		return 8
	case shardv1.DType_DTYPE_UINT8, shardv1.DType_DTYPE_INT8, shardv1.DType_DTYPE_BOOL:
		return 1
	}
	return 0
}

// grow extends dst by n elements and returns the extended slice and the new
// tail to fill.
func grow[T any](dst []T, n int) ([]T, []T) {
	dst = slices.Grow(dst, n)
	out := dst[:len(dst)+n]
	return out, out[len(dst):]
}

// AppendBF16ToF32 converts little-endian bf16 bytes in src to float32,
// appending to dst. len(src) must be even.
func AppendBF16ToF32(dst []float32, src []byte) []float32 {
	n := len(src) / 2
	dst, tail := grow(dst, n)
	bf16ToF32(tail, src[:2*n])
	return dst
}

// bf16ToF32 widens four elements per step through 64-bit loads and stores:
// each bf16 becomes the high half of its float32.
func bf16ToF32(dst []float32, src []byte) {
	n := len(dst)
	i := 0
	if n >= 4 {
		out := unsafe.Slice((*uint64)(unsafe.Pointer(&dst[0])), n/2)
		for ; i+4 <= n; i += 4 {
			x := binary.LittleEndian.Uint64(src[2*i:])
			o := out[i/2 : i/2+2 : i/2+2]
			o[0] = (x&0xFFFF)<<16 | (x&0xFFFF0000)<<32
			o[1] = (x>>32&0xFFFF)<<16 | (x>>32&0xFFFF0000)<<32
		}
	}
	for ; i < n; i++ {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
}

// AppendF32ToBF16 converts float32 values to little-endian bf16 bytes with
// round-to-nearest-even, appending to dst.
func AppendF32ToBF16(dst []byte, src []float32) []byte {
	dst, tail := grow(dst, 2*len(src))
	for i, f := range src {
		binary.LittleEndian.PutUint16(tail[2*i:], F32ToBF16(f))
	}
	return dst
}

// F32ToBF16 rounds one float32 to bf16 bits (nearest even; NaN stays NaN).
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7FFFFFFF > 0x7F800000 {
		return uint16(u>>16) | 0x0040 // quiet NaN, sign kept
	}
	u += 0x7FFF + (u>>16)&1
	return uint16(u >> 16)
}

// BF16ToF32 widens one bf16 value.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// AppendF16ToF32 converts little-endian IEEE half floats to float32,
// appending to dst.
func AppendF16ToF32(dst []float32, src []byte) []float32 {
	n := len(src) / 2
	dst, tail := grow(dst, n)
	for i := range tail {
		tail[i] = F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	}
	return dst
}

// AppendF32ToF16 converts float32 values to little-endian IEEE half floats
// (nearest even), appending to dst.
func AppendF32ToF16(dst []byte, src []float32) []byte {
	dst, tail := grow(dst, 2*len(src))
	for i, f := range src {
		binary.LittleEndian.PutUint16(tail[2*i:], F32ToF16(f))
	}
	return dst
}

// nativeLittleEndian is true on machines that store a float32 the way the
// wire does; there float32 <-> bytes is one memmove (a last hop's logits are
// 128 KB per token, and an element loop over them cost about 30 µs).
var nativeLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// f32Bytes views src's memory as bytes (no alignment requirement).
func f32Bytes(src []float32) []byte {
	if len(src) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*len(src))
}

// AppendF32Bytes appends float32 values as little-endian bytes.
func AppendF32Bytes(dst []byte, src []float32) []byte {
	dst, tail := grow(dst, 4*len(src))
	if nativeLittleEndian {
		copy(tail, f32Bytes(src))
		return dst
	}
	for i, f := range src {
		binary.LittleEndian.PutUint32(tail[4*i:], math.Float32bits(f))
	}
	return dst
}

// AppendF32FromBytes converts little-endian float32 bytes, appending to dst.
// A trailing partial element is ignored.
func AppendF32FromBytes(dst []float32, src []byte) []float32 {
	n := len(src) / 4
	dst, tail := grow(dst, n)
	if nativeLittleEndian {
		copy(f32Bytes(tail), src[:4*n])
		return dst
	}
	for i := range tail {
		tail[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
	return dst
}

// F16ToF32 widens one IEEE half float, exactly.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1F
	mant := uint32(h & 0x3FF)
	switch {
	case exp == 0x1F: // inf or NaN
		return math.Float32frombits(sign | 0x7F800000 | mant<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0: // signed zero
		return math.Float32frombits(sign)
	}
	// subnormal half: normalise into a float32 normal.
	e := uint32(113)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (mant&0x3FF)<<13)
}

// F32ToF16 rounds one float32 to IEEE half bits, nearest even, with overflow
// to infinity and NaN kept a NaN.
func F32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	exp := int32(u>>23) & 0xFF
	mant := u & 0x7FFFFF
	if exp == 0xFF {
		if mant != 0 {
			return sign | 0x7E00
		}
		return sign | 0x7C00
	}
	e := exp - 127 + 15
	if e >= 0x1F {
		return sign | 0x7C00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		mant |= 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		rest := mant & (1<<shift - 1)
		h := mant >> shift
		if rest > half || (rest == half && h&1 == 1) {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rest := mant & 0x1FFF
	if rest > 0x1000 || (rest == 0x1000 && h&1 == 1) {
		h++ // may carry into the exponent, which is still correct (up to inf)
	}
	return sign | uint16(h)
}
