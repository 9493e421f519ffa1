#include "isa.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

// The feature bits, in the order of shardd_isa_names.
enum {
    F_SSE3, F_SSSE3, F_SSE41, F_SSE42, F_POPCNT, F_AVX, F_AVX2, F_FMA, F_F16C, F_BMI2,
    F_AVX512F, F_AVX512BW, F_AVX512DQ, F_AVX512VL, F_AVX512CD, F_AVX512VBMI, F_AVX512VNNI,
    F_AVX512BF16, F_AVXVNNI, F_COUNT
};

static const char *const shardd_isa_names[] = {
    "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi2",
    "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx512vbmi", "avx512vnni",
    "avx512bf16", "avxvnni",
};
const char *shardd_isa_name(int i) { return i >= 0 && i < F_COUNT ? shardd_isa_names[i] : NULL; }

#define BIT(f) (1u << (f))
// x86-64 microarchitecture levels, as GCC's -march=x86-64-vN enables them.
#define LEVEL_V2 (BIT(F_SSE3) | BIT(F_SSSE3) | BIT(F_SSE41) | BIT(F_SSE42) | BIT(F_POPCNT))
#define LEVEL_V3 (LEVEL_V2 | BIT(F_AVX) | BIT(F_AVX2) | BIT(F_FMA) | BIT(F_F16C) | BIT(F_BMI2))
#define LEVEL_V4 (LEVEL_V3 | BIT(F_AVX512F) | BIT(F_AVX512BW) | BIT(F_AVX512DQ) | BIT(F_AVX512VL) | BIT(F_AVX512CD))

#define BASELINE __attribute__((target("arch=x86-64")))

BASELINE uint32_t shardd_isa_built(void) {
    uint32_t m = 0;
#ifdef __SSE3__
    m |= BIT(F_SSE3);
#endif
#ifdef __SSSE3__
    m |= BIT(F_SSSE3);
#endif
#ifdef __SSE4_1__
    m |= BIT(F_SSE41);
#endif
#ifdef __SSE4_2__
    m |= BIT(F_SSE42);
#endif
#ifdef __POPCNT__
    m |= BIT(F_POPCNT);
#endif
#ifdef __AVX__
    m |= BIT(F_AVX);
#endif
#ifdef __AVX2__
    m |= BIT(F_AVX2);
#endif
#ifdef __FMA__
    m |= BIT(F_FMA);
#endif
#ifdef __F16C__
    m |= BIT(F_F16C);
#endif
#ifdef __BMI2__
    m |= BIT(F_BMI2);
#endif
#ifdef __AVX512F__
    m |= BIT(F_AVX512F);
#endif
#ifdef __AVX512BW__
    m |= BIT(F_AVX512BW);
#endif
#ifdef __AVX512DQ__
    m |= BIT(F_AVX512DQ);
#endif
#ifdef __AVX512VL__
    m |= BIT(F_AVX512VL);
#endif
#ifdef __AVX512CD__
    m |= BIT(F_AVX512CD);
#endif
#ifdef __AVX512VBMI__
    m |= BIT(F_AVX512VBMI);
#endif
#ifdef __AVX512VNNI__
    m |= BIT(F_AVX512VNNI);
#endif
#ifdef __AVX512BF16__
    m |= BIT(F_AVX512BF16);
#endif
#ifdef __AVXVNNI__
    m |= BIT(F_AVXVNNI);
#endif
    return m;
}

BASELINE uint32_t shardd_isa_cpu(void) {
    uint32_t m = 0;
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) {
        return 0;
    }
    if (c & (1u << 0)) m |= BIT(F_SSE3);
    if (c & (1u << 9)) m |= BIT(F_SSSE3);
    if (c & (1u << 12)) m |= BIT(F_FMA);
    if (c & (1u << 19)) m |= BIT(F_SSE41);
    if (c & (1u << 20)) m |= BIT(F_SSE42);
    if (c & (1u << 23)) m |= BIT(F_POPCNT);
    if (c & (1u << 28)) m |= BIT(F_AVX);
    if (c & (1u << 29)) m |= BIT(F_F16C);
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        if (b & (1u << 5)) m |= BIT(F_AVX2);
        if (b & (1u << 8)) m |= BIT(F_BMI2);
        if (b & (1u << 16)) m |= BIT(F_AVX512F);
        if (b & (1u << 17)) m |= BIT(F_AVX512DQ);
        if (b & (1u << 28)) m |= BIT(F_AVX512CD);
        if (b & (1u << 30)) m |= BIT(F_AVX512BW);
        if (b & (1u << 31)) m |= BIT(F_AVX512VL);
        if (c & (1u << 1)) m |= BIT(F_AVX512VBMI);
        if (c & (1u << 11)) m |= BIT(F_AVX512VNNI);
        if (a >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) {
            if (a & (1u << 4)) m |= BIT(F_AVXVNNI);
            if (a & (1u << 5)) m |= BIT(F_AVX512BF16);
        }
    }
#endif
    return m;
}

BASELINE uint32_t shardd_isa_check(uint32_t built, uint32_t cpu, char *msg, size_t n) {
    uint32_t missing = built & ~cpu;
    if (n > 0) {
        msg[0] = 0;
    }
    if (missing == 0 || n == 0) {
        return missing;
    }
    const char *march = "x86-64";
    if ((cpu & LEVEL_V4) == LEVEL_V4) {
        march = "x86-64-v4";
    } else if ((cpu & LEVEL_V3) == LEVEL_V3) {
        march = "x86-64-v3";
    } else if ((cpu & LEVEL_V2) == LEVEL_V2) {
        march = "x86-64-v2";
    }
    size_t off = (size_t)snprintf(msg, n, "shardd: this binary's kernels were compiled for CPU features this CPU lacks:");
    for (int i = 0; i < F_COUNT && off < n; i++) {
        if (missing & BIT(i)) {
            off += (size_t)snprintf(msg + off, n - off, " %s", shardd_isa_names[i]);
        }
    }
    if (off < n) {
        snprintf(msg + off, n - off, ". Build for this CPU (make build MARCH=native on it) or for the oldest CPU of the fleet (make build MARCH=%s covers this one).", march);
    }
    return missing;
}

// Before any other initializer of the binary (llama.cpp's C++ statics are
// compiled for the same target and could already fault), refuse a CPU that
// lacks a feature the build uses, with a message instead of SIGILL.
BASELINE __attribute__((constructor(101))) static void shardd_isa_guard(void) {
    uint32_t cpu = shardd_isa_cpu();
    char msg[512];
    if (cpu != 0 && shardd_isa_check(shardd_isa_built(), cpu, msg, sizeof msg) != 0) {
        fprintf(stderr, "%s\n", msg);
        _exit(78);
    }
}
