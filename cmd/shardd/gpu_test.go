package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// The GPU scripts stay runnable where no GPU is: both parse, and the CUDA
// build's plan (scripts/cuda-lib.sh --dry-run: toolkit, architectures,
// ggml-cuda's sources from the pinned module, the nvcc line) comes out of
// the module as it is, without fetching or compiling anything.
func TestGPUScriptsDryRun(t *testing.T) {
	for _, s := range []string{"cuda-lib.sh", "gpu-check.sh"} {
		if out, err := exec.Command("bash", "-n", filepath.Join("..", "..", "scripts", s)).CombinedOutput(); err != nil {
			t.Fatalf("%s does not parse: %v\n%s", s, err, out)
		}
	}
	cmd := exec.Command("bash", filepath.Join("..", "..", "scripts", "cuda-lib.sh"), "--dry-run")
	cmd.Env = append(os.Environ(), "CUDA_ARCHS=86 90", "CUDA_HOME=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cuda-lib.sh --dry-run: %v\n%s", err, out)
	}
	plan := string(out)
	n := 0
	if i := strings.Index(plan, "sources: "); i >= 0 {
		fmt.Sscan(plan[i+len("sources: "):], &n)
	}
	for _, want := range []string{"code=sm_86", "code=sm_90", "code=compute_90", "-DGGML_CUDA_NO_VMM", "nvidia-cuda-nvcc=="} {
		if !strings.Contains(plan, want) {
			t.Errorf("the plan lacks %q:\n%s", want, plan)
		}
	}
	if n < 100 {
		t.Errorf("the plan compiles %d ggml-cuda sources, want ggml-cuda's list (144 in the pinned sdist's):\n%s", n, plan)
	}
	cmd = exec.Command("bash", filepath.Join("..", "..", "scripts", "cuda-lib.sh"), "--dry-run")
	cmd.Env = append(os.Environ(), "CUDA_ARCHS=9x")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "CUDA_ARCHS must be numbers") {
		t.Errorf("CUDA_ARCHS=9x: %v %s", err, out)
	}
}
