// The per-operation batch probe (opprobe.c): one row's result computed
// alone and among other rows, for TestOpVariance.
#ifndef SHARDD_OPPROBE_H
#define SHARDD_OPPROBE_H

#include <stdint.h>

enum shardd_probe_op {
    SHARDD_PROBE_MATMUL = 0,     // mul_mat of weights of type wtype by the rows
    SHARDD_PROBE_RMS_NORM = 1,   // rms_norm of each row
    SHARDD_PROBE_ROPE = 2,       // rope (normal mode) at the row's position
    SHARDD_PROBE_SOFTMAX = 3,    // soft_max_ext with a causal-style mask
    SHARDD_PROBE_ATTN = 4,       // attention by mul_mat, softmax, mul_mat
    SHARDD_PROBE_FLASH_ATTN = 5, // flash_attn_ext
    SHARDD_PROBE_MATMUL_WIDE = 6, // mul_mat as 0, weights over 8 MiB in q8_0 (an output head's size)
};

// Where the attention ops put each row's KV cells.
enum shardd_probe_layout {
    SHARDD_PROBE_BLOCKS = 0,      // row r's 40 cells after row r-1's
    SHARDD_PROBE_INTERLEAVED = 1, // cell c belongs to row c mod n
    SHARDD_PROBE_REVERSED = 2,    // blocks, the probed row's in reverse order when n > 1
    SHARDD_PROBE_PADDED = 3,      // blocks, then 512 cells no row sees
};

// shardd_probe runs op over n rows of which row pos is the probed one
// (the same inputs whatever n and pos), on threads threads, and copies the
// probed row's result to out (at most cap floats; the wide matmul's row is
// 12,288). For the attention ops each row attends to 40 cells of its own
// in a KV buffer of 40 x n cells, placed as interleave (a
// shardd_probe_layout) says. It returns the floats written, or -1.
int32_t shardd_probe(int32_t op, int32_t wtype, int32_t n, int32_t pos, int32_t interleave, int32_t threads,
                     float *out, int32_t cap);

#endif
