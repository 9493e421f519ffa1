// decode: one driver for two llama.cpp builds (scripts/llama-vs.sh links it
// against the pinned library and against upstream's), so that what differs
// is the library alone. SESSIONS sequences, each an 8-token prompt in one
// llama_decode, then NTG greedy steps of a row each in one llama_decode;
// llama.cpp's default context parameters (a KV stream per sequence, flash
// attention auto), one thread. Per repetition it prints the prompt
// forward's and a step's wall and process CPU milliseconds.
//   decode MODEL NTG REPS REPACK(0/1) [SESSIONS]
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void quiet(enum ggml_log_level l, const char *t, void *u) { (void)l; (void)t; (void)u; }
int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "decode MODEL NTG REPS REPACK(0/1) [SESSIONS]\n"); return 2; }
    const char *path = argv[1];
    int ntg = atoi(argv[2]), reps = atoi(argv[3]), repack = atoi(argv[4]);
    int ns = argc > 5 ? atoi(argv[5]) : 1;
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = repack; // weight repacking, where the build has it
    struct llama_model *m = llama_model_load_from_file(path, mp);
    if (!m) { fprintf(stderr, "load failed\n"); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 128 * ns; cp.n_batch = 512; cp.n_ubatch = 512; cp.n_seq_max = ns;
    cp.n_threads = 1; cp.n_threads_batch = 1; cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(m, cp);
    if (!ctx) { fprintf(stderr, "context failed\n"); return 1; }
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(m));
    struct llama_batch b = llama_batch_init(512, 0, 1);
    llama_token *tok = calloc(ns, sizeof *tok);
    for (int r = 0; r < reps; r++) {
        llama_memory_clear(llama_get_memory(ctx), true);
        b.n_tokens = 0;
        for (int s = 0; s < ns; s++)
            for (int i = 0; i < 8; i++) {
                int j = b.n_tokens++;
                b.token[j] = 1 + (7 * i + 13 * s) % 1000; b.pos[j] = i; b.n_seq_id[j] = 1; b.seq_id[j][0] = s; b.logits[j] = i == 7;
            }
        double pw0 = now(CLOCK_MONOTONIC), pc0 = now(CLOCK_PROCESS_CPUTIME_ID);
        if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
        double pw1 = now(CLOCK_MONOTONIC), pc1 = now(CLOCK_PROCESS_CPUTIME_ID);
        for (int s = 0; s < ns; s++) {
            const float *l = llama_get_logits_ith(ctx, 8 * s + 7);
            int best = 0; for (int k = 1; k < nv; k++) if (l[k] > l[best]) best = k;
            tok[s] = best;
        }
        double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
        for (int i = 0; i < ntg; i++) {
            b.n_tokens = 0;
            for (int s = 0; s < ns; s++) {
                int j = b.n_tokens++;
                b.token[j] = tok[s]; b.pos[j] = 8 + i; b.n_seq_id[j] = 1; b.seq_id[j][0] = s; b.logits[j] = 1;
            }
            if (llama_decode(ctx, b)) { fprintf(stderr, "decode failed\n"); return 1; }
            for (int s = 0; s < ns; s++) {
                const float *l = llama_get_logits_ith(ctx, s);
                int best = 0; for (int k = 1; k < nv; k++) if (l[k] > l[best]) best = k;
                tok[s] = best;
            }
        }
        double w1 = now(CLOCK_MONOTONIC), c1 = now(CLOCK_PROCESS_CPUTIME_ID);
        printf("prompt wall %.2f cpu %.2f ms; step wall %.3f cpu %.3f ms\n", (pw1 - pw0) * 1e3, (pc1 - pc0) * 1e3,
               (w1 - w0) * 1e3 / ntg, (c1 - c0) * 1e3 / ntg);
    }
    return 0;
}
