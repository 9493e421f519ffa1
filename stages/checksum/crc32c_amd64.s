#include "textflag.h"

// Folding constants for CRC32C (Castagnoli, reflected), k(n) =
// reverse32(x^n mod P) << 1, produced by crc32c_constants_test.go, which also
// checks that the same formula reproduces the published IEEE constants.
// Fold by 512 bits (four 128-bit lanes): low qword k(544), high qword k(480).
DATA fold512<>+0(SB)/8, $0x740eef02
DATA fold512<>+8(SB)/8, $0x9e4addf8
GLOBL fold512<>(SB), RODATA, $16
// Fold by 1024 bits (two 512-bit accumulators): k(1056), k(992).
DATA fold1024<>+0(SB)/8, $0x6992cea2
DATA fold1024<>+8(SB)/8, $0x0d3b6092
GLOBL fold1024<>(SB), RODATA, $16
// Fold by 128 bits: low qword k(160), high qword k(96).
DATA fold128<>+0(SB)/8, $0xf20c0dfe
DATA fold128<>+8(SB)/8, $0x14cd00bd6
GLOBL fold128<>(SB), RODATA, $16

// func foldCLMUL(crc uint32, p []byte) uint32
//
// Raw CRC32C (no pre/post inversion) of p continuing from crc. Requires
// len(p) >= 64 and len(p) a multiple of 16. Four independent lanes of 128
// bits are folded forward 64 bytes at a time with PCLMULQDQ, folded into one
// lane, and the last 16 bytes of remainder are reduced with the SSE4.2 CRC32
// instruction: folding preserves the message modulo P, so the CRC of the
// folded 16 bytes is the CRC of the whole input.
TEXT ·foldCLMUL(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX

	// With AVX-512 VPCLMULQDQ and at least 256 bytes, fold two 512-bit
	// accumulators (eight 128-bit lanes) 128 bytes at a time.
	CMPB ·haveAVX512(SB), $1
	JNE  sse
	CMPQ CX, $256
	JB   sse

	VMOVDQU64 0(SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVD     AX, X10 // VEX encoding zeroes the rest of Z10
	VPXORQ    Z10, Z1, Z1
	ADDQ      $128, SI
	SUBQ      $128, CX
	VBROADCASTI32X4 fold1024<>(SB), Z0

loop128:
	VMOVDQU64  0(SI), Z11
	VMOVDQU64  64(SI), Z12
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0x00, Z0, Z1, Z1
	VPCLMULQDQ $0x11, Z0, Z2, Z6
	VPCLMULQDQ $0x00, Z0, Z2, Z2
	VPTERNLOGD $0x96, Z11, Z5, Z1 // Z1 ^= Z5 ^ Z11
	VPTERNLOGD $0x96, Z12, Z6, Z2
	ADDQ $128, SI
	SUBQ $128, CX
	CMPQ CX, $128
	JAE  loop128

	// Fold the first accumulator into the second (512 bits ahead), then
	// continue with its four lanes in X1..X4.
	VBROADCASTI32X4 fold512<>(SB), Z0
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0x00, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z2, Z5, Z1
	VEXTRACTI32X4 $1, Z1, X2
	VEXTRACTI32X4 $2, Z1, X3
	VEXTRACTI32X4 $3, Z1, X4
	VZEROUPPER
	MOVOU fold512<>(SB), X0
	CMPQ  CX, $64
	JB    fold4
	JMP   loop64

sse:
	MOVOU 0(SI), X1
	MOVOU 16(SI), X2
	MOVOU 32(SI), X3
	MOVOU 48(SI), X4
	MOVL  AX, X0
	PXOR  X0, X1 // the running CRC enters as the first four bytes
	ADDQ  $64, SI
	SUBQ  $64, CX
	CMPQ  CX, $64
	JB    fold4

	MOVOU fold512<>(SB), X0

loop64:
	MOVOA X1, X5
	MOVOA X2, X6
	MOVOA X3, X7
	MOVOA X4, X8
	PCLMULQDQ $0x00, X0, X1
	PCLMULQDQ $0x00, X0, X2
	PCLMULQDQ $0x00, X0, X3
	PCLMULQDQ $0x00, X0, X4
	MOVOU 0(SI), X11
	MOVOU 16(SI), X12
	MOVOU 32(SI), X13
	MOVOU 48(SI), X14
	PCLMULQDQ $0x11, X0, X5
	PCLMULQDQ $0x11, X0, X6
	PCLMULQDQ $0x11, X0, X7
	PCLMULQDQ $0x11, X0, X8
	PXOR X5, X1
	PXOR X6, X2
	PXOR X7, X3
	PXOR X8, X4
	PXOR X11, X1
	PXOR X12, X2
	PXOR X13, X3
	PXOR X14, X4
	ADDQ $64, SI
	SUBQ $64, CX
	CMPQ CX, $64
	JAE  loop64

fold4:
	MOVOU fold128<>(SB), X0
	MOVOA X1, X5
	PCLMULQDQ $0x00, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR X5, X1
	PXOR X2, X1
	MOVOA X1, X5
	PCLMULQDQ $0x00, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR X5, X1
	PXOR X3, X1
	MOVOA X1, X5
	PCLMULQDQ $0x00, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR X5, X1
	PXOR X4, X1

loop16:
	CMPQ CX, $16
	JB   finish
	MOVOU 0(SI), X10
	MOVOA X1, X5
	PCLMULQDQ $0x00, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR X5, X1
	PXOR X10, X1
	ADDQ $16, SI
	SUBQ $16, CX
	JMP  loop16

finish:
	MOVQ   X1, AX
	PEXTRQ $1, X1, BX
	XORL   DX, DX
	CRC32Q AX, DX
	CRC32Q BX, DX
	MOVL   DX, ret+32(FP)
	RET
