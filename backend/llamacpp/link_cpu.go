//go:build !cuda

package llamacpp

// The CPU-only build links libshardd_llama.a (scripts/llama-lib.sh).

// #cgo LDFLAGS: -lshardd_llama -lstdc++ -lm
import "C"
