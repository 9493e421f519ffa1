// C helpers for backend/llamacpp: context creation with the parameters the
// ollama Go wrapper does not expose (kv_unified, cb_eval), and the eval
// callback that captures the residual stream before the tail norm.
#ifndef SHARDD_SHIM_H
#define SHARDD_SHIM_H

#include <stdbool.h>
#include <stdint.h>
#include "llama.h"

// Capture target for shardd_cb_eval. Owned by Go (allocated with C.malloc),
// read after llama_decode returns.
typedef struct shardd_capture {
    char    name[64];    // graph node to capture, "l_out-<n_layer-1>"; empty: none
    float  *dst;         // cap_floats floats
    int64_t cap_floats;
    int64_t n_floats;    // written so far in this decode
    int32_t bad;         // 1: node not f32/contiguous, 2: overflow
    // Layers whose output l_out-<i> is rounded to bf16 in place as soon as
    // it is computed (nearest even, as the wire rounds it): the whole model
    // computing what a route with a bf16 boundary after each of them
    // computes. any_round: at least one is set.
    uint8_t round_bf16[256];
    int32_t any_round;
} shardd_capture;

void shardd_backend_init(int verbose);

// ggml's tiled K-quant matmul (scripts/llama-patches/cpu-tiled.patch), on
// by default, for every forward of the process: set it, and read it.
void ggml_cpu_shardd_set_tiled(bool on);
bool ggml_cpu_shardd_tiled(void);

// shardd_load_model loads path with n_gpu_layers of its layers (more than
// it has: the output layer too) on GPU device gpu (an index into
// shardd_gpu_*), and nothing on a device when n_gpu_layers is 0.
struct llama_model *shardd_load_model(const char *path, int32_t n_gpu_layers, int32_t gpu);

// The GPU devices ggml registered (none in a CPU-only build): how many, and
// the i-th's name ("CUDA0"), description and memory in bytes. false: no
// such device.
int32_t shardd_gpu_count(void);
bool shardd_gpu_info(int32_t i, char *name, size_t name_len, char *desc, size_t desc_len, size_t *free_b,
                     size_t *total_b);
// shardd_gpu_build names the GPU backend compiled in ("cuda"), or is "".
const char *shardd_gpu_build(void);
struct llama_context *shardd_new_context(struct llama_model *model, uint32_t n_ctx, uint32_t n_batch,
                                         uint32_t n_ubatch, uint32_t n_seq_max, int32_t threads,
                                         bool kv_unified, shardd_capture *cap);
// shardd_attach_threadpool gives ctx its own CPU threadpool with the given
// polling level (0: idle threads sleep; 100: they spin). Free it with
// ggml_threadpool_free after llama_free. With pin, and no more threads than
// allowed CPUs, the pool's threads are pinned one per CPU and *main_cpu is
// the CPU for the thread that calls shardd_decode (else -1).
struct ggml_threadpool *shardd_attach_threadpool(struct llama_context *ctx, int32_t threads, uint32_t poll,
                                                 bool pin, int32_t *main_cpu);
// shardd_decode is llama_decode with the calling thread pinned to main_cpu
// for the call's length (main_cpu < 0: not pinned).
int32_t shardd_decode(struct llama_context *ctx, struct llama_batch batch, int32_t main_cpu);
void shardd_threadpool_free(struct ggml_threadpool *tp);

// Preemption: llama.cpp's abort callback stops a forward when both words are
// non-zero: preempt (set by any thread) and enabled (set around a
// preemptible forward).
typedef struct shardd_preempt {
    int32_t preempt;
    int32_t enabled;
} shardd_preempt;
void shardd_set_preempt(struct llama_context *ctx, shardd_preempt *p);
bool shardd_cb_eval(struct ggml_tensor *t, bool ask, void *user_data);
bool shardd_seq_rm(struct llama_context *ctx, int32_t seq, int32_t p0);
// shardd_reset_if_empty clears the KV cache's cell bookkeeping (its head
// back to cell 0) when no sequence below n_seq holds a cell, and reports
// whether it did.
bool shardd_reset_if_empty(struct llama_context *ctx, int32_t n_seq);

// The benchmarks' baseline (Plain in baseline.go).
struct llama_context *shardd_plain_context(struct llama_model *model, uint32_t n_ctx, uint32_t n_batch,
                                           int32_t threads);
int32_t shardd_plain_decode_embd(struct llama_context *ctx, struct llama_batch *b, const float *emb, int32_t n_embd,
                                 int32_t pos);

#endif
