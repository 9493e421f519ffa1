package llamacpp

/*
#include <stdlib.h>
#include "llama.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"strings"
	"unsafe"
)

// quantTypes are the weight types Quantize writes: llama.cpp's own file
// types, as its llama-quantize names them.
var quantTypes = map[string]C.enum_llama_ftype{
	"q4_k_m": C.LLAMA_FTYPE_MOSTLY_Q4_K_M,
	"q4_k_s": C.LLAMA_FTYPE_MOSTLY_Q4_K_S,
	"q5_k_m": C.LLAMA_FTYPE_MOSTLY_Q5_K_M,
	"q6_k":   C.LLAMA_FTYPE_MOSTLY_Q6_K,
	"q8_0":   C.LLAMA_FTYPE_MOSTLY_Q8_0,
}

// QuantTypes lists the types Quantize accepts.
func QuantTypes() []string { return []string{"q4_K_M", "q4_K_S", "q5_K_M", "q6_K", "q8_0"} }

// Quantize writes src's weights as typ (for example "q4_K_M": q4_K for most
// matrices, q6_K for some, as llama.cpp's llama-quantize chooses) to dst,
// with llama.cpp's own quantizer: a file like the ones people download.
// Matrices whose rows are not a multiple of the k-quant block (256) fall
// back to a type llama.cpp picks.
func Quantize(src, dst, typ string) error {
	ft, ok := quantTypes[strings.ToLower(typ)]
	if !ok {
		return fmt.Errorf("llamacpp: cannot quantize to %q (want one of %s)", typ, strings.Join(QuantTypes(), ", "))
	}
	initOnce.Do(func() { backendInit(false) })
	p := C.llama_model_quantize_default_params()
	p.ftype = ft
	p.nthread = C.int32_t(runtime.NumCPU())
	csrc, cdst := C.CString(src), C.CString(dst)
	defer C.free(unsafe.Pointer(csrc))
	defer C.free(unsafe.Pointer(cdst))
	if rc := C.llama_model_quantize(csrc, cdst, &p); rc != 0 {
		return fmt.Errorf("llamacpp: quantizing %s to %s failed (%d)", src, typ, int(rc))
	}
	return nil
}
