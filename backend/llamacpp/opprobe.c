// The per-operation batch probe: see opprobe.h.
#include <math.h>
#include <string.h>
#include "ggml.h"
#include "ggml-cpu.h"
#include "opprobe.h"

// A fixed generator: the probed row's inputs come from its own stream, the
// other rows' from another, so they are the same whatever n and pos.
static float next(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

static void fill_rows(struct ggml_tensor *t, int64_t width, int32_t n, int32_t pos) {
    uint32_t mine = 99, other = 1234;
    for (int32_t r = 0; r < n; r++) {
        for (int64_t i = 0; i < width; i++) {
            ((float *)t->data)[r * width + i] = next(r == pos ? &mine : &other);
        }
    }
}

static struct ggml_tensor *weights(struct ggml_context *ctx, enum ggml_type type, int64_t k, int64_t m, float *tmp) {
    uint32_t s = 7;
    for (int64_t i = 0; i < k * m; i++) tmp[i] = next(&s) * 0.2f;
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, type, k, m);
    if (type == GGML_TYPE_F32) {
        memcpy(w->data, tmp, sizeof(float) * k * m);
    } else if (type == GGML_TYPE_F16) {
        for (int64_t i = 0; i < k * m; i++) ((ggml_fp16_t *)w->data)[i] = ggml_fp32_to_fp16(tmp[i]);
    } else if (type == GGML_TYPE_BF16) {
        for (int64_t i = 0; i < k * m; i++) ((ggml_bf16_t *)w->data)[i] = ggml_fp32_to_bf16(tmp[i]);
    } else {
        ggml_quantize_chunk(type, tmp, w->data, 0, m, k, NULL);
    }
    return w;
}

// attention builds q [D, n, H], k and v [D, 40 n, H] (f16) and the mask
// [40 n, n]: row r sees its own 40 cells, in blocks (row r's cells follow
// row r-1's), interleaved (cell c is row c mod n's), in blocks with the
// probed row's cells in reverse order (what a KV buffer shared by sessions
// gives a session whose later positions landed in earlier cells), or in
// blocks followed by 512 cells that no row sees (a row alone in a buffer
// whose other sessions' cells lie after its own).
static struct ggml_tensor *attention(struct ggml_context *ctx, int flash, int32_t n, int32_t pos, int32_t interleave) {
    const int64_t D = 64, H = 4, L = 40, nkv = L * n + (interleave == SHARDD_PROBE_PADDED ? 512 : 0);
    struct ggml_tensor *q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, n, H);
    struct ggml_tensor *k = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, D, nkv, H);
    struct ggml_tensor *v = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, D, nkv, H);
    struct ggml_tensor *mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, nkv, n);
    uint32_t mq = 11, mk = 13, other = 17;
    for (int64_t h = 0; h < H; h++)
        for (int32_t r = 0; r < n; r++)
            for (int64_t d = 0; d < D; d++) ((float *)q->data)[(h * n + r) * D + d] = next(r == pos ? &mq : &other);
    // The probed row's cells hold the same values whatever n; with
    // SHARDD_PROBE_REVERSED and other rows present, in the opposite order.
    static float own[4][40][64];
    for (int64_t h = 0; h < H; h++)
        for (int64_t j = 0; j < L; j++)
            for (int64_t d = 0; d < D; d++) own[h][j][d] = next(&mk);
    for (int64_t h = 0; h < H; h++) {
        int64_t j = 0;
        for (int64_t c = 0; c < nkv; c++) {
            int64_t owner = interleave == SHARDD_PROBE_INTERLEAVED ? c % n : c < L * n ? c / L : -1;
            for (int64_t d = 0; d < D; d++) {
                float x = 0;
                if (owner != pos) {
                    x = next(&other);
                } else if (interleave == SHARDD_PROBE_REVERSED && n > 1) {
                    x = own[h][L - 1 - j][d];
                } else {
                    x = own[h][j][d];
                }
                ((ggml_fp16_t *)k->data)[(h * nkv + c) * D + d] = ggml_fp32_to_fp16(x);
                ((ggml_fp16_t *)v->data)[(h * nkv + c) * D + d] = ggml_fp32_to_fp16(0.5f * x);
            }
            j += owner == pos;
        }
    }
    for (int32_t r = 0; r < n; r++) {
        for (int64_t c = 0; c < nkv; c++) {
            int64_t owner = interleave == SHARDD_PROBE_INTERLEAVED ? c % n : c < L * n ? c / L : -1;
            ((ggml_fp16_t *)mask->data)[r * nkv + c] = ggml_fp32_to_fp16(owner == r ? 0.0f : -INFINITY);
        }
    }
    float scale = 1.0f / sqrtf((float)D);
    if (flash) {
        return ggml_flash_attn_ext(ctx, q, k, v, mask, scale, 0.0f, 0.0f); // [D, H, n]
    }
    struct ggml_tensor *kq = ggml_soft_max_ext(ctx, ggml_mul_mat(ctx, k, q), mask, scale, 0.0f); // [nkv, n, H]
    struct ggml_tensor *vt = ggml_cont(ctx, ggml_transpose(ctx, ggml_cast(ctx, v, GGML_TYPE_F32)));
    return ggml_cont(ctx, ggml_permute(ctx, ggml_mul_mat(ctx, vt, kq), 0, 2, 1, 3)); // [D, H, n]
}

int32_t shardd_probe(int32_t op, int32_t wtype, int32_t n, int32_t pos, int32_t interleave, int32_t threads,
                     float *out, int32_t cap) {
    const int64_t K = 768;
    // The wide matmul's 12,288 x 768 weights are 9.6 MiB in q8_0: sgemm
    // tiles a matrix that large otherwise than one that may sit in cache
    // (sgemm-y-q0-one-pass.patch), and its rows must keep their bits too.
    const int64_t M = op == SHARDD_PROBE_MATMUL_WIDE ? 12288 : 512;
    if (n < 1 || pos < 0 || pos >= n) return -1;
    struct ggml_init_params p = {(size_t)(op == SHARDD_PROBE_MATMUL_WIDE ? 128 : 64) << 20, NULL, false};
    struct ggml_context *ctx = ggml_init(p);
    if (ctx == NULL) return -1;
    struct ggml_tensor *y = NULL;
    int64_t width = 0; // floats of the probed row's result
    float *tmp = NULL;
    switch (op) {
    case SHARDD_PROBE_MATMUL:
    case SHARDD_PROBE_MATMUL_WIDE: {
        tmp = (float *)ggml_new_tensor_1d(ctx, GGML_TYPE_F32, K * M)->data;
        struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, n);
        fill_rows(x, K, n, pos);
        y = ggml_mul_mat(ctx, weights(ctx, (enum ggml_type)wtype, K, M, tmp), x);
        width = M;
        break;
    }
    case SHARDD_PROBE_RMS_NORM: {
        struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, n);
        fill_rows(x, K, n, pos);
        y = ggml_rms_norm(ctx, x, 1e-6f);
        width = K;
        break;
    }
    case SHARDD_PROBE_ROPE: {
        const int64_t D = 64, H = 12;
        struct ggml_tensor *x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, D, H, n);
        fill_rows(x, D * H, n, pos);
        struct ggml_tensor *positions = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n);
        for (int32_t r = 0; r < n; r++) ((int32_t *)positions->data)[r] = r == pos ? 17 : 100 + r;
        y = ggml_rope(ctx, x, positions, (int)D, 0);
        width = D * H;
        break;
    }
    case SHARDD_PROBE_SOFTMAX: {
        struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, n);
        fill_rows(x, K, n, pos);
        struct ggml_tensor *mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, K, n);
        for (int32_t r = 0; r < n; r++)
            for (int64_t c = 0; c < K; c++)
                ((ggml_fp16_t *)mask->data)[r * K + c] = ggml_fp32_to_fp16(c < 500 ? 0.0f : -INFINITY);
        y = ggml_soft_max_ext(ctx, x, mask, 0.125f, 0.0f);
        width = K;
        break;
    }
    case SHARDD_PROBE_ATTN:
    case SHARDD_PROBE_FLASH_ATTN:
        y = attention(ctx, op == SHARDD_PROBE_FLASH_ATTN, n, pos, interleave);
        width = 64 * 4;
        break;
    default:
        ggml_free(ctx);
        return -1;
    }
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    if (ggml_graph_compute_with_ctx(ctx, gf, threads) != GGML_STATUS_SUCCESS || width > cap) {
        ggml_free(ctx);
        return -1;
    }
    memcpy(out, (const float *)y->data + (int64_t)pos * width, sizeof(float) * (size_t)width);
    ggml_free(ctx);
    return (int32_t)width;
}
