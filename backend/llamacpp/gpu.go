package llamacpp

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"strconv"
	"unsafe"
)

// ErrNoGPU is Open's error when Config.GPULayers asks for a device that
// is not there: the build has no GPU backend, the backend found no device,
// or Config.Device names none of those it found.
var ErrNoGPU = errors.New("llamacpp: no GPU device")

// AllLayers is Config.GPULayers for every layer of the shard and its output
// layer.
const AllLayers = -1

// GPU is a device ggml can put layers on.
type GPU struct {
	Index       int    // as Config.Device takes it
	Name        string // ggml's name, "CUDA0"
	Description string // the device's own, "NVIDIA H200"
	FreeBytes   uint64
	TotalBytes  uint64
}

// GPUBuild names the GPU backend this binary was built with ("cuda"), or
// is "" for a CPU-only build (make build; make build-cuda has one).
func GPUBuild() string {
	initOnce.Do(func() { backendInit(false) })
	return C.GoString(C.shardd_gpu_build())
}

// GPUs lists the devices the GPU backend found (none in a CPU-only build,
// and none in a GPU build on a machine without a usable device).
func GPUs() []GPU {
	initOnce.Do(func() { backendInit(false) })
	var out []GPU
	var name, desc [256]C.char
	for i := range int(C.shardd_gpu_count()) {
		var free, total C.size_t
		if !C.shardd_gpu_info(C.int32_t(i), &name[0], C.size_t(len(name)), &desc[0], C.size_t(len(desc)), &free, &total) {
			break
		}
		out = append(out, GPU{Index: i, Name: C.GoString(&name[0]), Description: C.GoString(&desc[0]),
			FreeBytes: uint64(free), TotalBytes: uint64(total)})
	}
	return out
}

// findGPU resolves Config.Device (an index, or a name such as "CUDA0"; ""
// is the first device) among gpus.
func findGPU(gpus []GPU, device string) (GPU, error) {
	if len(gpus) == 0 {
		if GPUBuild() == "" {
			return GPU{}, fmt.Errorf("%w: this binary is a CPU-only build (make build-cuda makes one with CUDA)", ErrNoGPU)
		}
		return GPU{}, fmt.Errorf("%w: the %s backend found no usable device (no GPU, no driver, or not visible to this process)", ErrNoGPU, GPUBuild())
	}
	if device == "" {
		return gpus[0], nil
	}
	for _, g := range gpus {
		if g.Name == device || strconv.Itoa(g.Index) == device {
			return g, nil
		}
	}
	names := make([]string, len(gpus))
	for i, g := range gpus {
		names[i] = g.Name
	}
	return GPU{}, fmt.Errorf("%w: no device %q (found %v)", ErrNoGPU, device, names)
}

// placement resolves cfg's GPU settings for a shard of layers layers: the
// device (nil: none), the layer count llama.cpp is given, and the backend
// name and device string the worker reports.
func placement(cfg Config, layers int) (gpu *GPU, ngl int, err error) {
	if cfg.GPULayers == 0 {
		return nil, 0, nil
	}
	g, err := findGPU(GPUs(), cfg.Device)
	if err != nil {
		return nil, 0, err
	}
	ngl = cfg.GPULayers
	if ngl < 0 || ngl > layers {
		ngl = layers + 1 // the output layer too
	}
	return &g, ngl, nil
}

// gpuDevice is the CapabilityReport's device for layers on g: its name,
// description and memory.
func gpuDevice(g *GPU, ngl, layers int) string {
	return fmt.Sprintf("%s:%s (%d MiB, %d of %d layers)", g.Name, g.Description, g.TotalBytes>>20, min(ngl, layers), layers)
}

// loadModel loads path with ngl layers on gpu (nil: none).
func loadModel(path string, gpu *GPU, ngl int) *C.struct_llama_model {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	idx := 0
	if gpu != nil {
		idx = gpu.Index
	}
	return C.shardd_load_model(cpath, C.int32_t(ngl), C.int32_t(idx))
}
