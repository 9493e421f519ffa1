package llamacpp

import (
	"slices"
	"strings"
	"testing"
)

// TestKernelsLines: the recipe's kernel lines name this build (library
// version and patches) and the instruction set ggml's kernels were
// compiled for, which agrees with the features the start check reads from
// the same flags; the thread count is in neither.
func TestKernelsLines(t *testing.T) {
	lines := Kernels()
	t.Logf("this build's kernel lines:\n  %s", strings.Join(lines, "\n  "))
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "build=llama.cpp ") || !strings.Contains(lines[0], "patches=") ||
		!strings.HasPrefix(lines[1], "isa=") {
		t.Fatalf("kernel lines %q", lines)
	}
	for _, l := range lines {
		if strings.Contains(l, "; ") {
			t.Fatalf("a kernel line holds the recipe separator: %q", l)
		}
	}
	isa := KernelISA()
	built := HostISA()
	names := built.Names(built.Built)
	for ggml, ours := range map[string]string{"avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512": "avx512f", "avx512_bf16": "avx512bf16"} {
		if slices.Contains(isa, ggml) != slices.Contains(names, ours) {
			t.Errorf("ggml compiled %s: %v; the start check's flags have %s: %v", ggml, slices.Contains(isa, ggml), ours, slices.Contains(names, ours))
		}
	}
}

// TestISACheck: a binary compiled for features the CPU lacks is refused
// with a message that names them and the MARCH that covers the CPU; on
// this machine the build runs. The CPUs are fake feature sets, since the
// machine running the test may have every feature.
func TestISACheck(t *testing.T) {
	host := HostISA()
	t.Logf("built for %v; this CPU has %v", host.Names(host.Built), host.Names(host.CPU))
	if missing, msg := host.Check(); missing != 0 {
		t.Fatalf("this build is refused on the machine that runs it: %s", msg)
	}
	bits := func(names ...string) uint32 {
		var m uint32
		for i := 0; i < 32; i++ {
			n := ISA{}.Names(1 << i)
			if len(n) == 1 && slices.Contains(names, n[0]) {
				m |= 1 << i
			}
		}
		return m
	}
	v2 := bits("sse3", "ssse3", "sse4.1", "sse4.2", "popcnt")
	v3 := v2 | bits("avx", "avx2", "fma", "f16c", "bmi2")
	v4 := v3 | bits("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd")
	for _, c := range []struct {
		name       string
		built, cpu uint32
		missing    []string
		march      string
	}{
		{"AVX-512 build on an AVX2 CPU", v4 | bits("avx512bf16"), v3, []string{"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx512bf16"}, "MARCH=x86-64-v3"},
		{"x86-64-v3 build on an x86-64-v2 CPU", v3, v2, []string{"avx", "avx2", "fma", "f16c", "bmi2"}, "MARCH=x86-64-v2"},
		{"x86-64-v3 build on an AVX-512 CPU", v3, v4, nil, ""},
	} {
		missing, msg := ISA{Built: c.built, CPU: c.cpu}.Check()
		if got := (ISA{}).Names(missing); !slices.Equal(got, c.missing) {
			t.Errorf("%s: missing %v, want %v", c.name, got, c.missing)
		}
		if c.missing == nil {
			if msg != "" {
				t.Errorf("%s: refused: %s", c.name, msg)
			}
			continue
		}
		for _, want := range append(slices.Clone(c.missing), c.march) {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: the message does not name %s: %s", c.name, want, msg)
			}
		}
	}
}
