package gguf

import (
	"encoding/binary"
	"math"

	"github.com/meshnet/shardd/stages/dtype"
)

// q8Block is the number of weights in one q8_0 block: an f16 scale followed
// by 32 int8 values.
const (
	q8Block     = 32
	q8BlockSize = 2 + q8Block
)

// appendQ8_0 quantizes src (len a multiple of 32) to ggml's q8_0 layout.
func appendQ8_0(dst []byte, src []float32) []byte {
	for b := 0; b+q8Block <= len(src); b += q8Block {
		blk := src[b : b+q8Block]
		var amax float32
		for _, v := range blk {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		dst = binary.LittleEndian.AppendUint16(dst, dtype.F32ToF16(d))
		inv := float32(0)
		if d != 0 {
			inv = 1 / d
		}
		for _, v := range blk {
			dst = append(dst, byte(int8(math.Round(float64(v*inv)))))
		}
	}
	return dst
}
