package main

import (
	"strings"
	"testing"

	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/gguf"
)

// serve --gpu-layers all where no GPU can take the layers (this CPU-only
// build, or a GPU build on a machine without a device): by default the
// worker refuses to start, saying why and what flag serves on the CPU;
// with --gpu-fallback cpu it serves every layer on the CPU, and its
// device says the CPU. Both through serve's own path to the backend.
func TestServeWithoutGPU(t *testing.T) {
	if gpus := llamacpp.GPUs(); len(gpus) > 0 {
		t.Skipf("this machine has a GPU (%s): scripts/gpu-check.sh covers serving on it", gpus[0].Name)
	}
	model := tinyModel(t, t.TempDir())
	meta, err := gguf.Read(model)
	if err != nil {
		t.Fatal(err)
	}
	open := func(args ...string) (*llamacpp.Backend, error) {
		c, err := parseServe(append([]string{"--model", model, "--threads", "1", "--max-sessions", "2", "--ctx-tokens", "256", "--log-level", "error"}, args...))
		if err != nil {
			t.Fatal(err)
		}
		return c.openBackend(meta)
	}
	want := "CPU-only build"
	if llamacpp.GPUBuild() != "" {
		want = "found no usable device"
	}
	for _, args := range [][]string{{"--gpu-layers", "all"}, {"--gpu-layers", "3", "--device", "CUDA0"}} {
		be, err := open(args...)
		if be != nil || err == nil || !strings.Contains(err.Error(), "no GPU device") || !strings.Contains(err.Error(), want) ||
			!strings.Contains(err.Error(), "--gpu-fallback cpu") {
			t.Fatalf("%v: %v, want a refusal naming the missing GPU (%q) and --gpu-fallback", args, err, want)
		}
	}
	be, err := open("--gpu-layers", "all", "--gpu-fallback", "cpu")
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if info := be.Info(); !strings.HasPrefix(info.Device, "cpu:") || !strings.HasSuffix(info.Name, " cpu") {
		t.Fatalf("fallback serves on %q (%q), want the CPU", info.Device, info.Name)
	}
}
