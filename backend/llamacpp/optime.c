// Timed operations: see optime.h.
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ggml.h"
#include "ggml-cpu.h"
#include "gguf.h"
#include "optime.h"

struct shardd_timed {
    struct ggml_context *meta; // the model's tensors, their data in map
    struct ggml_context *ctx;  // the rows, results and graphs
    struct gguf_context *gguf;
    void *map;
    size_t map_size;
    int32_t parts;
    struct ggml_cgraph **graphs; // per part; NULL: nothing to compute
    uint64_t *shapes;            // per part: a hash of its matrices' types and shapes
    uint8_t *work;
    size_t work_size;
};

static float rnd(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 65536.0f - 0.5f;
}

static shardd_timed *timed_new(int32_t parts, size_t bytes) {
    shardd_timed *t = calloc(1, sizeof *t);
    if (t == NULL) return NULL;
    t->parts = parts;
    t->graphs = calloc((size_t)parts, sizeof *t->graphs);
    t->shapes = calloc((size_t)parts, sizeof *t->shapes);
    struct ggml_init_params p = {bytes + (size_t)parts * ggml_graph_overhead() + ((size_t)4 << 20), NULL, false};
    t->ctx = t->graphs == NULL || t->shapes == NULL ? NULL : ggml_init(p);
    if (t->ctx == NULL) {
        shardd_timed_free(t);
        return NULL;
    }
    return t;
}

// part is the part a tensor of the model belongs to: its block, layers
// for the head, -1 for neither.
static int32_t part(const char *name, int32_t layers, int tied) {
    int b = -1, used = 0;
    if (sscanf(name, "blk.%d.%n", &b, &used) == 1 && used > 0) return b >= 0 && b < layers ? b : -1;
    if (strcmp(name, "output.weight") == 0) return layers;
    if (tied && strcmp(name, "token_embd.weight") == 0) return layers;
    return -1;
}

shardd_timed *shardd_timed_model(const char *path, int32_t layers, int32_t n) {
    if (layers <= 0 || n <= 0) return NULL;
    struct ggml_context *meta = NULL;
    struct gguf_init_params gp = {true, &meta};
    struct gguf_context *g = gguf_init_from_file(path, gp);
    if (g == NULL) return NULL;
    int tied = gguf_find_tensor(g, "output.weight") < 0;
    size_t bytes = 0;
    for (struct ggml_tensor *w = ggml_get_first_tensor(meta); w != NULL; w = ggml_get_next_tensor(meta, w)) {
        if (ggml_n_dims(w) >= 2 && part(ggml_get_name(w), layers, tied) >= 0) {
            bytes += sizeof(float) * (size_t)n * (size_t)(w->ne[0] + ggml_nrows(w)) + 2 * ggml_tensor_overhead();
        }
    }
    shardd_timed *t = timed_new(layers + 1, bytes);
    if (t == NULL) {
        gguf_free(g);
        ggml_free(meta);
        return NULL;
    }
    t->gguf = g;
    t->meta = meta;
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        shardd_timed_free(t);
        return NULL;
    }
    t->map_size = (size_t)st.st_size;
    t->map = mmap(NULL, t->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (t->map == MAP_FAILED) {
        t->map = NULL;
        shardd_timed_free(t);
        return NULL;
    }
    size_t base = gguf_get_data_offset(g);
    uint32_t s = 7;
    for (struct ggml_tensor *w = ggml_get_first_tensor(meta); w != NULL; w = ggml_get_next_tensor(meta, w)) {
        int32_t p = part(ggml_get_name(w), layers, tied);
        if (ggml_n_dims(w) < 2 || p < 0) continue;
        int64_t id = gguf_find_tensor(g, ggml_get_name(w));
        size_t off = base + gguf_get_tensor_offset(g, id);
        if (off + ggml_nbytes(w) > t->map_size) {
            shardd_timed_free(t);
            return NULL;
        }
        w->data = (uint8_t *)t->map + off;
        struct ggml_tensor *x = ggml_new_tensor_2d(t->ctx, GGML_TYPE_F32, w->ne[0], n);
        for (int64_t i = 0; i < w->ne[0] * n; i++) ((float *)x->data)[i] = rnd(&s);
        struct ggml_tensor *w2 = ggml_n_dims(w) == 2 ? w : ggml_reshape_2d(t->ctx, w, w->ne[0], ggml_nrows(w));
        if (t->graphs[p] == NULL) t->graphs[p] = ggml_new_graph(t->ctx);
        ggml_build_forward_expand(t->graphs[p], ggml_mul_mat(t->ctx, w2, x));
        uint64_t h = t->shapes[p] != 0 ? t->shapes[p] : 14695981039346656037ull; // FNV-1a over types and shapes
        int64_t key[5] = {w->type, w->ne[0], w->ne[1], w->ne[2], w->ne[3]};
        for (size_t i = 0; i < sizeof key; i++) h = (h ^ ((const uint8_t *)key)[i]) * 1099511628211ull;
        t->shapes[p] = h;
    }
    return t;
}

shardd_timed *shardd_timed_attention(int32_t heads, int32_t dim, int32_t cells, int32_t n) {
    if (heads <= 0 || dim <= 0 || cells <= 0 || n <= 0) return NULL;
    const int64_t D = dim, H = heads, nkv = (int64_t)cells * n;
    size_t bytes = sizeof(float) * (size_t)(D * n * H * 2) + 2 * sizeof(ggml_fp16_t) * (size_t)(D * nkv * H) +
                   sizeof(ggml_fp16_t) * (size_t)(nkv * n);
    shardd_timed *t = timed_new(1, bytes);
    if (t == NULL) return NULL;
    struct ggml_tensor *q = ggml_new_tensor_3d(t->ctx, GGML_TYPE_F32, D, n, H);
    struct ggml_tensor *k = ggml_new_tensor_3d(t->ctx, GGML_TYPE_F16, D, nkv, H);
    struct ggml_tensor *v = ggml_new_tensor_3d(t->ctx, GGML_TYPE_F16, D, nkv, H);
    struct ggml_tensor *mask = ggml_new_tensor_2d(t->ctx, GGML_TYPE_F16, nkv, n);
    uint32_t s = 11;
    for (int64_t i = 0; i < D * n * H; i++) ((float *)q->data)[i] = rnd(&s);
    for (int64_t i = 0; i < D * nkv * H; i++) {
        ((ggml_fp16_t *)k->data)[i] = ggml_fp32_to_fp16(rnd(&s));
        ((ggml_fp16_t *)v->data)[i] = ggml_fp32_to_fp16(rnd(&s));
    }
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < nkv; c++)
            ((ggml_fp16_t *)mask->data)[r * nkv + c] = ggml_fp32_to_fp16(c / cells == r ? 0.0f : -INFINITY);
    t->graphs[0] = ggml_new_graph(t->ctx);
    ggml_build_forward_expand(t->graphs[0], ggml_flash_attn_ext(t->ctx, q, k, v, mask, 1.0f / sqrtf((float)D), 0.0f, 0.0f));
    return t;
}

uint64_t shardd_timed_shape(shardd_timed *t, int32_t p) { return p >= 0 && p < t->parts ? t->shapes[p] : 0; }

int32_t shardd_timed_run(shardd_timed *t, int32_t p, int32_t threads) {
    if (p < 0 || p >= t->parts) return -1;
    if (t->graphs[p] == NULL) return 1;
    struct ggml_cplan plan = ggml_graph_plan(t->graphs[p], threads, NULL);
    if (plan.work_size > t->work_size) {
        uint8_t *w = realloc(t->work, plan.work_size);
        if (w == NULL) return -1;
        t->work = w;
        t->work_size = plan.work_size;
    }
    plan.work_data = t->work;
    return ggml_graph_compute(t->graphs[p], &plan) == GGML_STATUS_SUCCESS ? 0 : -1;
}

void shardd_timed_free(shardd_timed *t) {
    if (t == NULL) return;
    if (t->ctx != NULL) ggml_free(t->ctx);
    if (t->meta != NULL) ggml_free(t->meta);
    if (t->gguf != NULL) gguf_free(t->gguf);
    if (t->map != NULL) munmap(t->map, t->map_size);
    free(t->graphs);
    free(t->shapes);
    free(t->work);
    free(t);
}
