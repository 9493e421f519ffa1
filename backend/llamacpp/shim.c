#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "shim.h"

static int shardd_verbose = 0;

// Quiet logger: llama.cpp logs every tensor at load and warns about
// conditions that are normal for a shard (a middle shard's placeholder
// vocabulary, a context smaller than the training length). Keep errors
// unless verbose.
static void shardd_log(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    // A preempted forward is aborted on purpose; llama.cpp reports that at
    // three levels as a failure (compute status 1 = GGML_STATUS_ABORTED,
    // decode return 2 = aborted).
    if (!shardd_verbose && (strstr(text, "failed with error 1") != NULL || strstr(text, "compute status: 1") != NULL ||
                            strstr(text, "failed to decode, ret = 2") != NULL)) {
        return;
    }
    if (shardd_verbose || level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static bool shardd_quiet_progress(float progress, void *ud) {
    (void)progress; (void)ud;
    return true;
}

void shardd_backend_init(int verbose) {
    shardd_verbose = verbose;
    llama_log_set(shardd_log, NULL);
    llama_backend_init();
}

// shardd_gpu returns the i-th GPU device, or NULL.
static ggml_backend_dev_t shardd_gpu(int32_t i) {
    for (size_t d = 0; d < ggml_backend_dev_count(); d++) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(d);
        if (ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_GPU && i-- == 0) {
            return dev;
        }
    }
    return NULL;
}

int32_t shardd_gpu_count(void) {
    int32_t n = 0;
    while (shardd_gpu(n) != NULL) {
        n++;
    }
    return n;
}

bool shardd_gpu_info(int32_t i, char *name, size_t name_len, char *desc, size_t desc_len, size_t *free_b,
                     size_t *total_b) {
    ggml_backend_dev_t dev = shardd_gpu(i);
    if (dev == NULL) {
        return false;
    }
    snprintf(name, name_len, "%s", ggml_backend_dev_name(dev));
    snprintf(desc, desc_len, "%s", ggml_backend_dev_description(dev));
    ggml_backend_dev_memory(dev, free_b, total_b);
    return true;
}

const char *shardd_gpu_build(void) {
#ifdef GGML_USE_CUDA
    return "cuda";
#else
    return "";
#endif
}

struct llama_model *shardd_load_model(const char *path, int32_t n_gpu_layers, int32_t gpu) {
    struct llama_model_params p = llama_model_default_params();
    // An empty list (its NULL alone) keeps llama.cpp from taking every
    // device it finds: layers go where the caller says, or stay on the CPU.
    ggml_backend_dev_t devs[2] = {NULL, NULL};
    if (n_gpu_layers > 0) {
        devs[0] = shardd_gpu(gpu);
        if (devs[0] == NULL) {
            return NULL;
        }
    }
    p.devices = devs;
    p.n_gpu_layers = n_gpu_layers;
    p.split_mode = LLAMA_SPLIT_MODE_NONE;
    p.main_gpu = devs[0] != NULL ? 0 : -1; // -1: no device at all
    p.load_mode = LLAMA_LOAD_MODE_MMAP;
    // No repacked weights (ggml's extra buffer types): October's repacked
    // K-quant kernels round by batch size, as the tiled kernel does, and
    // repacking cannot be switched off for the exact mode after a load.
    // It also keeps the weights in the mapped file, shared by every shard
    // of the machine that maps it.
    p.use_extra_bufts = false;
    p.progress_callback = shardd_quiet_progress;
    return llama_model_load_from_file(path, p);
}

struct llama_context *shardd_new_context(struct llama_model *model, uint32_t n_ctx, uint32_t n_batch,
                                         uint32_t n_ubatch, uint32_t n_seq_max, int32_t threads,
                                         bool kv_unified, shardd_capture *cap) {
    struct llama_context_params p = llama_context_default_params();
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    p.n_ubatch = n_ubatch;
    p.n_seq_max = n_seq_max;
    p.n_threads = threads;
    p.n_threads_batch = threads;
    p.embeddings = false;
    // Mixed-session batches keep batch order only with a unified KV buffer;
    // a KV stream per sequence keeps each sequence's cells where they would
    // be alone (Config.SeparateKV).
    p.kv_unified = kv_unified;
    p.no_perf = true;
    if (cap != NULL && (cap->name[0] != 0 || cap->any_round)) {
        p.cb_eval = shardd_cb_eval;
        p.cb_eval_user_data = cap;
    }
    return llama_init_from_model(model, p);
}

// Asked once per graph node (ask=true: do we want it?) and called again after
// a wanted node is computed (ask=false). Copies the wanted node's rows out and
// returns false, which ends the graph there: the tail norm and output head of
// an intermediate shard are never computed.
static bool shardd_rounds(const shardd_capture *c, const struct ggml_tensor *t) {
    if (!c->any_round || strncmp(t->name, "l_out-", 6) != 0) {
        return false;
    }
    char *end = NULL;
    long layer = strtol(t->name + 6, &end, 10);
    return end != t->name + 6 && *end == 0 && layer >= 0 && layer < 256 && c->round_bf16[layer];
}

// shardd_round_bf16 rounds a float to the nearest bf16 (ties to even; NaN
// stays a quiet NaN with its sign), as stages/dtype.F32ToBF16 does, and
// widens it back.
static float shardd_round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        u = (u & 0xFFFF0000u) | 0x00400000u;
    } else {
        u += 0x7FFFu + ((u >> 16) & 1u);
        u &= 0xFFFF0000u;
    }
    memcpy(&f, &u, sizeof f);
    return f;
}

bool shardd_cb_eval(struct ggml_tensor *t, bool ask, void *user_data) {
    shardd_capture *c = (shardd_capture *)user_data;
    if (ask) {
        return shardd_rounds(c, t) || (c->name[0] != 0 && strcmp(t->name, c->name) == 0);
    }
    if (shardd_rounds(c, t)) {
        if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
            c->bad = 1;
            return false;
        }
        int64_t n = ggml_nelements(t);
        float *v = (float *)malloc((size_t)n * sizeof(float));
        if (v == NULL) {
            c->bad = 3;
            return false;
        }
        ggml_backend_tensor_get(t, v, 0, (size_t)n * sizeof(float));
        for (int64_t i = 0; i < n; i++) {
            v[i] = shardd_round_bf16(v[i]);
        }
        ggml_backend_tensor_set(t, v, 0, (size_t)n * sizeof(float));
        free(v);
        return true;
    }
    if (c->name[0] == 0 || strcmp(t->name, c->name) != 0) {
        return true;
    }
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
        c->bad = 1;
        return false;
    }
    int64_t n = ggml_nelements(t);
    if (c->n_floats + n > c->cap_floats) {
        c->bad = 2;
        return false;
    }
    ggml_backend_tensor_get(t, c->dst + c->n_floats, 0, (size_t)n * sizeof(float));
    c->n_floats += n;
    return false;
}

bool shardd_seq_rm(struct llama_context *ctx, int32_t seq, int32_t p0) {
    return llama_memory_seq_rm(llama_get_memory(ctx), seq, p0, -1);
}

bool shardd_reset_if_empty(struct llama_context *ctx, int32_t n_seq) {
    llama_memory_t mem = llama_get_memory(ctx);
    for (int32_t s = 0; s < n_seq; s++) {
        if (llama_memory_seq_pos_max(mem, s) >= 0) {
            return false;
        }
    }
    llama_memory_clear(mem, false);
    return true;
}

// The CPUs this process may run on, read once, when the first pinned
// threadpool is made.
static cpu_set_t shardd_allowed;
static int shardd_allowed_ok = 0;
static pthread_once_t shardd_allowed_once = PTHREAD_ONCE_INIT;

static void shardd_read_allowed(void) {
    shardd_allowed_ok = sched_getaffinity(0, sizeof shardd_allowed, &shardd_allowed) == 0;
}

struct ggml_threadpool *shardd_attach_threadpool(struct llama_context *ctx, int32_t threads, uint32_t poll,
                                                 bool pin, int32_t *main_cpu) {
    struct ggml_threadpool_params p = ggml_threadpool_params_default(threads);
    p.poll = poll;
    *main_cpu = -1;
    if (pin) {
        pthread_once(&shardd_allowed_once, shardd_read_allowed);
    }
    // One CPU per thread, or no pinning (two compute threads on one CPU make
    // ggml's spinning barriers wait out whole time slices); a single thread
    // has no barrier to protect.
    pin = pin && shardd_allowed_ok && threads > 1 && threads <= CPU_COUNT(&shardd_allowed);
    cpu_set_t before;
    pin = pin && sched_getaffinity(0, sizeof before, &before) == 0;
    if (pin) {
        // ggml gives workers 1..n-1 the first allowed CPUs in order and the
        // calling thread (worker 0) the next one.
        int seen = 0;
        for (int i = 0; i < GGML_MAX_N_THREADS && i < CPU_SETSIZE; i++) {
            if (!CPU_ISSET(i, &shardd_allowed)) {
                continue;
            }
            p.cpumask[i] = true;
            if (++seen == threads) {
                *main_cpu = i;
            }
        }
        p.strict_cpu = true;
    }
    struct ggml_threadpool *tp = ggml_threadpool_new(&p);
    if (pin) {
        // ggml pinned the creating thread as worker 0; that is a Go thread,
        // which runs other goroutines too. Forwards pin it for their length
        // only (shardd_decode).
        sched_setaffinity(0, sizeof before, &before);
    }
    if (tp != NULL) {
        llama_attach_threadpool(ctx, tp, tp);
    }
    return tp;
}

int32_t shardd_decode(struct llama_context *ctx, struct llama_batch batch, int32_t main_cpu) {
    if (main_cpu < 0) {
        return llama_decode(ctx, batch);
    }
    // The calling thread gets back whatever it had (the process's CPUs, or
    // what an operator set since).
    cpu_set_t saved, one;
    if (sched_getaffinity(0, sizeof saved, &saved) != 0) {
        return llama_decode(ctx, batch);
    }
    CPU_ZERO(&one);
    CPU_SET(main_cpu, &one);
    sched_setaffinity(0, sizeof one, &one);
    int32_t rc = llama_decode(ctx, batch);
    sched_setaffinity(0, sizeof saved, &saved);
    return rc;
}

void shardd_threadpool_free(struct ggml_threadpool *tp) {
    ggml_threadpool_free(tp);
}

static bool shardd_abort(void *data) {
    shardd_preempt *p = (shardd_preempt *)data;
    return __atomic_load_n(&p->enabled, __ATOMIC_ACQUIRE) && __atomic_load_n(&p->preempt, __ATOMIC_ACQUIRE);
}

void shardd_set_preempt(struct llama_context *ctx, shardd_preempt *p) {
    llama_set_abort_callback(ctx, shardd_abort, p);
}

// The benchmarks' baseline: llama.cpp driven the plain way, with its default
// context parameters as ollama's Go wrapper sets them (one sequence, batch
// and micro-batch of n_batch rows, embeddings on, flash attention auto), and
// llama_decode on a batch of embeddings.
struct llama_context *shardd_plain_context(struct llama_model *model, uint32_t n_ctx, uint32_t n_batch,
                                           int32_t threads) {
    struct llama_context_params p = llama_context_default_params();
    p.n_ctx = n_ctx;
    p.n_batch = n_batch;
    p.n_ubatch = n_batch;
    p.n_seq_max = 1;
    p.n_threads = threads;
    p.n_threads_batch = threads;
    p.embeddings = true;
    p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
    return llama_init_from_model(model, p);
}

int32_t shardd_plain_decode_embd(struct llama_context *ctx, struct llama_batch *b, const float *emb, int32_t n_embd,
                                 int32_t pos) {
    memcpy(b->embd, emb, sizeof(float) * (size_t)n_embd);
    b->n_tokens = 1;
    b->pos[0] = pos;
    b->n_seq_id[0] = 1;
    b->seq_id[0][0] = 0;
    b->logits[0] = 1;
    return llama_decode(ctx, *b);
}
