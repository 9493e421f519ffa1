// Timed operations (optime.c) for split --by time: a model's matmuls with
// its own weights, part by part, and attention of its shape, on ggml's CPU
// backend, run as often as the caller times them.
#ifndef SHARDD_OPTIME_H
#define SHARDD_OPTIME_H

#include <stdint.h>

typedef struct shardd_timed shardd_timed;

// shardd_timed_model maps the GGUF at path and builds, for each block
// 0..layers-1 and for the output head (part layers: output.weight, or the
// token embedding a model ties to it), a graph that multiplies n rows by
// every weight matrix of the part (a 3-D expert tensor as one matrix of
// all its experts). NULL when it cannot.
shardd_timed *shardd_timed_model(const char *path, int32_t layers, int32_t n);

// shardd_timed_attention builds a flash_attn_ext over n rows of heads
// query heads of dim each, every row attending to cells f16 cells of its
// own (in blocks, the rest masked, as sessions sharing a KV buffer have
// them): one part, 0. NULL when it cannot.
shardd_timed *shardd_timed_attention(int32_t heads, int32_t dim, int32_t cells, int32_t n);

// shardd_timed_shape is a hash of the types and shapes of part's
// matrices: parts with the same do the same work.
uint64_t shardd_timed_shape(shardd_timed *t, int32_t part);

// shardd_timed_run computes part once on threads threads: 0 when it ran,
// 1 when the part has nothing to compute, -1 on failure.
int32_t shardd_timed_run(shardd_timed *t, int32_t part, int32_t threads);

void shardd_timed_free(shardd_timed *t);

#endif
