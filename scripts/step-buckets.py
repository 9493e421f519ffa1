#!/usr/bin/env python3
"""Sort `perf report --no-children --sort sym -n --stdio -g none` lines into
buckets (issue 44's accounting) and print each bucket's share and its
CPU microseconds per unit.

    step-buckets.py REPORT.txt SAMPLE_HZ UNITS

UNITS: what the window did (tokens generated, or decode steps); the CPU
time of a bucket is its samples / SAMPLE_HZ.
"""
import re
import sys

BUCKETS = [
    ("llama.cpp: matmul kernels", r"ggml_vec_dot|ggml_gemv|ggml_gemm|mul_mat|quantize_row|q4_1|q4_K|q8_0|q8_1|q8_K|q6_K|tinyblas|repack|ggml_compute_forward_get_rows"),
    ("llama.cpp: attention", r"flash_attn|soft_max|ggml_vec_dot_f16|ggml_vec_mad|ggml_vec_scale"),
    ("llama.cpp: other ops", r"^ggml_compute_forward|^ggml_vec_|rms_norm|rope|ggml_fp16|ggml_fp32|ggml_cpu_|ggml_.*_f32$|silu|gelu|add_f32"),
    ("llama.cpp: threads and barriers", r"ggml_barrier|ggml_graph_compute_thread|ggml_graph_compute_secondary|sched_yield|pthread"),
    ("llama.cpp: graph build, schedule, batch", r"^llm_|^llama|^ggml_|^gguf|^std::|^operator new|^operator delete|^_Z"),
    ("kernel", r"^\[k\]"),
    ("libc: memcpy, memset, malloc", r"memcpy|memmove|memset|malloc|^free$|_int_free|_int_malloc|cfree"),
    ("Go: gRPC, protobuf, net", r"google\.golang\.org|golang\.org/x/net|^net\.|^net/|^syscall\.|^internal/poll|^crypto/|hash/crc32|vtproto|planetscale"),
    ("Go: shardd engine, backend, stages", r"meshnet/shardd/(engine|backend|kvcache|stages|bufpool|frames|relay|telemetry|internal)"),
    ("Go: shardd head (route, load, sampling)", r"meshnet/shardd/(route|load|api|cmd)"),
    ("Go: runtime (GC, scheduler, cgo)", r"^runtime\.|^_cgo|^crosscall|^x_cgo|^sync\.|^internal/|^math|^sort|^slices|^strconv|^fmt|^time\.|^os\.|^io\."),
]

LINE = re.compile(r"^\s*([\d.]+)%\s+(\d+)\s+(\[[.kg]\])\s+(.*)$")


def main():
    path, hz, units = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    totals = {name: 0 for name, _ in BUCKETS}
    totals["other"] = 0
    top_other = []
    all_samples = 0
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if not m:
            continue
        samples, kind, sym = int(m.group(2)), m.group(3), m.group(4).strip()
        all_samples += samples
        key = "[k]" if kind == "[k]" else sym
        for name, pat in BUCKETS:
            if re.search(pat, key):
                totals[name] += samples
                break
        else:
            totals["other"] += samples
            top_other.append((samples, sym))
    if all_samples == 0:
        print("no samples")
        return
    print(f"{'bucket':45} {'share':>7} {'CPU us/unit':>12}")
    for name, n in sorted(totals.items(), key=lambda kv: -kv[1]):
        if n:
            print(f"{name:45} {100 * n / all_samples:6.1f}% {1e6 * n / hz / units:12.1f}")
    print(f"{'all':45} {100.0:6.1f}% {1e6 * all_samples / hz / units:12.1f}")
    for n, s in sorted(top_other, reverse=True)[:5]:
        print(f"  other: {100 * n / all_samples:5.1f}% {s[:80]}")


if __name__ == "__main__":
    main()
