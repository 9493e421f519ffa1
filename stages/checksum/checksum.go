// Package checksum verifies and computes the contract's payload checksum:
// CRC32C (Castagnoli) over the uncompressed canonical bytes, its value
// encoded big-endian in Checksum.value.
package checksum

import (
	"encoding/binary"
	"hash/crc32"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/wireerr"
)

const corrupt = shardv1.ErrorCode_ERROR_CODE_PAYLOAD_CORRUPT

// Refusals.
var (
	ErrMismatch  = wireerr.New(corrupt, "checksum: CRC32C does not match the payload")
	ErrMissing   = wireerr.New(corrupt, "checksum: payload carries no checksum and policy requires one")
	ErrAlgorithm = wireerr.New(corrupt, "checksum: unsupported checksum algorithm")
	ErrValueSize = wireerr.New(corrupt, "checksum: CRC32C value must be 4 bytes")
)

var table = crc32.MakeTable(crc32.Castagnoli)

// Policy decides whether a tensor without a checksum is accepted.
type Policy struct {
	// Require refuses tensors whose checksum is absent or NONE.
	Require bool
}

// CRC32C returns the CRC32C of the concatenation of segs.
func CRC32C(segs [][]byte) uint32 {
	var c uint32
	for _, s := range segs {
		c = update(c, s)
	}
	return c
}

// Verify checks sum against the uncompressed body given as segs.
func Verify(sum *shardv1.Checksum, segs [][]byte, p Policy) error {
	alg := shardv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_UNSPECIFIED
	if sum != nil {
		alg = sum.Algorithm
	}
	switch alg {
	case shardv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C:
	case shardv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_NONE,
		shardv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_UNSPECIFIED:
		if p.Require {
			return ErrMissing
		}
		return nil
	default:
		return wireerr.Errorf(ErrAlgorithm, "%s", alg)
	}
	if len(sum.Value) != 4 {
		return wireerr.Errorf(ErrValueSize, "got %d bytes", len(sum.Value))
	}
	want := binary.BigEndian.Uint32(sum.Value)
	if got := CRC32C(segs); got != want {
		return wireerr.Errorf(ErrMismatch, "got %08x, want %08x", got, want)
	}
	return nil
}

// Fill sets sum to the CRC32C of body, reusing sum.Value's storage.
func Fill(sum *shardv1.Checksum, body []byte) {
	sum.Algorithm = shardv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C
	sum.Value = binary.BigEndian.AppendUint32(sum.Value[:0], update(0, body))
}
