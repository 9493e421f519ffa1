package llamacpp

/*
#include <stdlib.h>
#include "ggml-cpu.h"
#include "isa.h"
const char *shardd_llama_build(void);
*/
import "C"

import (
	"strings"
	"unsafe"
)

// Build is how this binary's llama.cpp and ggml were made, as
// scripts/llama-lib.sh compiled it into the library: the module version,
// the patches applied (names and a hash of their text), the compilers and
// their flags, -march resolved to the target it meant. It is a line of the
// runtime recipe: two builds that differ in any of these may compute other
// bits.
func Build() string { return C.GoString(C.shardd_llama_build()) }

// KernelISA lists the instruction-set features ggml's CPU kernels were
// compiled to use (ggml_cpu_has_*: compile-time, whatever the CPU): they
// choose the kernels, so they are a line of the runtime recipe.
func KernelISA() []string {
	var out []string
	for _, f := range []struct {
		name string
		has  C.int
	}{
		{"sse3", C.ggml_cpu_has_sse3()}, {"ssse3", C.ggml_cpu_has_ssse3()}, {"avx", C.ggml_cpu_has_avx()},
		{"avx2", C.ggml_cpu_has_avx2()}, {"bmi2", C.ggml_cpu_has_bmi2()}, {"f16c", C.ggml_cpu_has_f16c()},
		{"fma", C.ggml_cpu_has_fma()}, {"avx_vnni", C.ggml_cpu_has_avx_vnni()}, {"avx512", C.ggml_cpu_has_avx512()},
		{"avx512_vbmi", C.ggml_cpu_has_avx512_vbmi()}, {"avx512_vnni", C.ggml_cpu_has_avx512_vnni()},
		{"avx512_bf16", C.ggml_cpu_has_avx512_bf16()}, {"amx_int8", C.ggml_cpu_has_amx_int8()},
		{"llamafile", C.ggml_cpu_has_llamafile()},
	} {
		if f.has != 0 {
			out = append(out, f.name)
		}
	}
	return out
}

// Kernels are the runtime recipe's lines that name this build's kernels
// (backend.Info.Kernels).
func Kernels() []string {
	return []string{"build=" + Build(), "isa=" + strings.Join(KernelISA(), " ")}
}

// ISA is the instruction-set check a binary runs before anything else
// (isa.c: a constructor that exits with the message rather than die of
// SIGILL): the features its C and C++ code were compiled for, and this
// CPU's, as bit masks over isaNames.
type ISA struct{ Built, CPU uint32 }

// HostISA is this binary's and this CPU's.
func HostISA() ISA { return ISA{Built: uint32(C.shardd_isa_built()), CPU: uint32(C.shardd_isa_cpu())} }

// Names lists the features of mask.
func (ISA) Names(mask uint32) []string {
	var out []string
	for i := 0; ; i++ {
		n := C.shardd_isa_name(C.int(i))
		if n == nil {
			return out
		}
		if mask&(1<<i) != 0 {
			out = append(out, C.GoString(n))
		}
	}
}

// Check is the start check's verdict: the features the build uses that
// the CPU lacks and the message that names them and the MARCH to build
// with ("" when it can run).
func (i ISA) Check() (missing uint32, msg string) {
	buf := (*C.char)(C.malloc(512))
	defer C.free(unsafe.Pointer(buf))
	missing = uint32(C.shardd_isa_check(C.uint32_t(i.Built), C.uint32_t(i.CPU), buf, 512))
	return missing, C.GoString(buf)
}
