// The instruction-set check: what this build's kernels were compiled to use
// against what the CPU has. Everything here is compiled for baseline
// x86-64, so it runs on the CPU it may have to refuse.
#pragma once
#include <stddef.h>
#include <stdint.h>

// shardd_isa_name(i) names bit i of the masks (NULL past the last).
const char *shardd_isa_name(int i);
// The features the C and C++ code of this binary were compiled for.
uint32_t shardd_isa_built(void);
// The features this CPU has (0 where it cannot tell: not x86-64).
uint32_t shardd_isa_cpu(void);
// shardd_isa_check writes into msg (at most n bytes) why a binary built
// for built cannot run on a CPU with cpu, naming the missing features and
// the MARCH to build with, and returns the missing mask (0: it can run).
uint32_t shardd_isa_check(uint32_t built, uint32_t cpu, char *msg, size_t n);
