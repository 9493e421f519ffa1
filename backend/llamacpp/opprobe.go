package llamacpp

/*
#include "ggml.h"
#include "opprobe.h"
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// probeOp is an operation of the CPU forward that the batch probe runs.
type probeOp int32

const (
	probeMatmul     probeOp = C.SHARDD_PROBE_MATMUL
	probeRMSNorm    probeOp = C.SHARDD_PROBE_RMS_NORM
	probeRope       probeOp = C.SHARDD_PROBE_ROPE
	probeSoftmax    probeOp = C.SHARDD_PROBE_SOFTMAX
	probeAttn       probeOp = C.SHARDD_PROBE_ATTN
	probeFlashAttn  probeOp = C.SHARDD_PROBE_FLASH_ATTN
	probeMatmulWide probeOp = C.SHARDD_PROBE_MATMUL_WIDE
)

// probeLayout is where the attention probes put each row's KV cells.
type probeLayout int32

const (
	probeBlocks      probeLayout = C.SHARDD_PROBE_BLOCKS
	probeInterleaved probeLayout = C.SHARDD_PROBE_INTERLEAVED
	probeReversed    probeLayout = C.SHARDD_PROBE_REVERSED
	probePadded      probeLayout = C.SHARDD_PROBE_PADDED
)

// probeTypes are the weight types the matmul probe runs, by name.
var probeTypes = map[string]int32{
	"f32": C.GGML_TYPE_F32, "f16": C.GGML_TYPE_F16, "bf16": C.GGML_TYPE_BF16, "q8_0": C.GGML_TYPE_Q8_0,
	"q4_0": C.GGML_TYPE_Q4_0, "q4_1": C.GGML_TYPE_Q4_1, "q5_0": C.GGML_TYPE_Q5_0, "q4_K": C.GGML_TYPE_Q4_K, "q5_K": C.GGML_TYPE_Q5_K, "q6_K": C.GGML_TYPE_Q6_K,
}

// probe runs op on ggml's CPU backend over n rows, of which row pos has
// the same inputs whatever n and pos, and returns that row's result: what
// the op computes for one session's row alone (n = 1) or among other
// sessions' rows. The attention ops give each row 40 KV cells of its own,
// laid out as layout says. It is the
// measurement behind TestOpVariance (which operations a batch changes).
func probe(op probeOp, wtype int32, n, pos int, layout probeLayout, threads int) ([]float32, error) {
	initOnce.Do(func() { backendInit(false) })
	out := make([]float32, 12288)
	got := C.shardd_probe(C.int32_t(op), C.int32_t(wtype), C.int32_t(n), C.int32_t(pos), C.int32_t(layout), C.int32_t(threads),
		(*C.float)(unsafe.Pointer(&out[0])), C.int32_t(len(out)))
	if got < 0 {
		return nil, fmt.Errorf("llamacpp: probe of op %d over %d rows failed", op, n)
	}
	return out[:got], nil
}

// withTiled runs f with ggml's tiled K-quant matmul on (as the default mode
// runs) or off (as the exact mode does), and then as it was.
func withTiled(on bool, f func()) {
	exactOpen.Lock()
	defer exactOpen.Unlock()
	was := bool(C.ggml_cpu_shardd_tiled())
	C.ggml_cpu_shardd_set_tiled(C.bool(on))
	defer C.ggml_cpu_shardd_set_tiled(C.bool(was))
	f()
}

// tiledOn reports whether ggml's tiled K-quant matmul is on.
func tiledOn() bool { return bool(C.ggml_cpu_shardd_tiled()) }
