#include "textflag.h"

DATA negInf<>+0(SB)/4, $0xff800000
GLOBL negInf<>(SB), RODATA, $4

// func maxAVX2(v []float32) float32
//
// The largest value of v, NaN never taken (-Inf if every value is -Inf or
// NaN). Requires len(v) a multiple of 32 and at least 32. Four running
// maxima of 8 lanes; VMAXPS returns its second source (the running maximum)
// when the new value is NaN or compares equal, so no NaN ever enters them.
TEXT ·maxAVX2(SB), NOSPLIT, $0-28
	MOVQ v_base+0(FP), SI
	MOVQ v_len+8(FP), CX
	VBROADCASTSS negInf<>(SB), Y0
	VMOVAPS Y0, Y1
	VMOVAPS Y0, Y2
	VMOVAPS Y0, Y3

loop:
	VMOVUPS 0(SI), Y4
	VMOVUPS 32(SI), Y5
	VMOVUPS 64(SI), Y6
	VMOVUPS 96(SI), Y7
	VMAXPS  Y0, Y4, Y0
	VMAXPS  Y1, Y5, Y1
	VMAXPS  Y2, Y6, Y2
	VMAXPS  Y3, Y7, Y3
	ADDQ    $128, SI
	SUBQ    $32, CX
	JNZ     loop

	VMAXPS       Y1, Y0, Y0
	VMAXPS       Y3, Y2, Y2
	VMAXPS       Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS       X1, X0, X0
	VPERMILPS    $0x4e, X0, X1
	VMAXPS       X1, X0, X0
	VPERMILPS    $0xb1, X0, X1
	VMAXPS       X1, X0, X0
	VZEROUPPER
	MOVSS        X0, ret+24(FP)
	RET

// func firstEqAVX2(v []float32, m float32) int
//
// The first index i with v[i] == m, or len(v) if there is none (m is not
// NaN). Requires len(v) a multiple of 32. 32 values an iteration: four
// ordered compares for equality, one test of their union; in the block that
// holds a match, the four lane masks make one 32-bit mask, whose lowest set
// bit is the answer.
TEXT ·firstEqAVX2(SB), NOSPLIT, $0-40
	MOVQ         v_base+0(FP), SI
	MOVQ         v_len+8(FP), CX
	VBROADCASTSS m+24(FP), Y0
	XORQ         AX, AX

loop:
	CMPQ    AX, CX
	JAE     none
	VCMPPS  $0, 0(SI)(AX*4), Y0, Y1
	VCMPPS  $0, 32(SI)(AX*4), Y0, Y2
	VCMPPS  $0, 64(SI)(AX*4), Y0, Y3
	VCMPPS  $0, 96(SI)(AX*4), Y0, Y4
	VORPS   Y1, Y2, Y5
	VORPS   Y3, Y4, Y6
	VORPS   Y5, Y6, Y5
	VPTEST  Y5, Y5
	JNZ     found
	ADDQ    $32, AX
	JMP     loop

found:
	VMOVMSKPS Y1, DX
	VMOVMSKPS Y2, BX
	SHLL      $8, BX
	ORL       BX, DX
	VMOVMSKPS Y3, BX
	SHLL      $16, BX
	ORL       BX, DX
	VMOVMSKPS Y4, BX
	SHLL      $24, BX
	ORL       BX, DX
	BSFL      DX, DX
	ADDQ      DX, AX
	VZEROUPPER
	MOVQ      AX, ret+32(FP)
	RET

none:
	VZEROUPPER
	MOVQ CX, ret+32(FP)
	RET
