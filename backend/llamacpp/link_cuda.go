//go:build cuda

package llamacpp

// The CUDA build (make build-cuda) links libshardd_llama.a compiled with
// GGML_USE_CUDA, so ggml registers the CUDA backend beside the CPU's, and
// libshardd_ggml_cuda.a (scripts/cuda-lib.sh) with the CUDA runtime and
// cuBLAS from the toolkit wheels; the Makefile puts their folders on the
// linker's path and the toolkit's on the binary's run path. The two
// archives call each other, hence the group.

// #cgo CPPFLAGS: -DGGML_USE_CUDA
// #cgo LDFLAGS: -Wl,--start-group -lshardd_llama -lshardd_ggml_cuda -Wl,--end-group
// #cgo LDFLAGS: -lcublas -lcublasLt -lcudart_static -ldl -lrt -lpthread -lstdc++ -lm
import "C"
