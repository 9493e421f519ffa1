#!/usr/bin/env bash
# gpu-check.sh: every GPU check in one command, for the first machine with
# an NVIDIA GPU at hand (README: The GPU forward). Not yet run on one: the
# CUDA compile for one architecture took 17.6 minutes on 2 cores here, so
# expect a few minutes of it on 16, then a few of checks and load.
#
#   scripts/gpu-check.sh [OUT]            run everything; results under OUT (default out/gpu-check)
#   scripts/gpu-check.sh --dry-run [OUT]  no GPU needed: builds the CPU binary, checks the
#                                         refusal without a GPU, prints the CUDA build's plan
#                                         and every command the real run would run
#
# What it runs, in order:
#   1. the GPU: nvidia-smi's name, compute capability, memory and driver;
#   2. make build-cuda for that GPU's architecture alone (CUDA_ARCHS);
#   3. shardd verify with every layer on the GPU, on a generated model and
#      on a real one (SmolLM2): each 2- and 3-way split bitwise equal to the
#      whole model on the same GPU (f32 boundary) and to the whole model
#      rounded where the route rounds (bf16);
#   4. the harness, --sweep concurrency=1,16,64: a two-shard route on the
#      GPU against the unsplit model on the GPU (gpu.json, gpu.html), and
#      the same on the CPU (cpu.json, cpu.html), so route-on-GPU against
#      whole-on-CPU is one division of the two files' figures;
#   5. summary.txt: the GPU, build time, verify verdicts, and each run's
#      tokens/s and TTFT/ITL p50 by concurrency.
# It needs network for the CUDA wheels (PyPI) unless ~/.cache/shardd/cuda
# already holds the toolkit, or an installed CUDA 12/13 toolkit is found
# (CUDA_HOME, or nvcc on PATH), which is then used instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dry=0
if [ "${1:-}" = --dry-run ]; then
	dry=1
	shift
fi
out=$(realpath -m "${1:-out/gpu-check}")
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
say() { echo "gpu-check: $*" | tee -a "$summary"; }
run() { # run LOG CMD...: log it, and run it (output to LOG) unless this is a dry run
	local log=$1
	shift
	echo "  \$ $* > $log" | tee -a "$summary"
	[ "$dry" = 1 ] || "$@" >"$log" 2>&1
}

# 1. The GPU.
arch=${CUDA_ARCHS:-}
if [ "$dry" = 0 ]; then
	if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
		echo "gpu-check: no NVIDIA GPU here (nvidia-smi finds none); scripts/gpu-check.sh --dry-run checks the rest" >&2
		exit 1
	fi
	gpu=$(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader | head -1)
	say "GPU: $gpu"
	[ -n "$arch" ] || arch=$(echo "$gpu" | cut -d, -f2 | tr -d ' .')
else
	say "dry run: no GPU used"
	[ -n "$arch" ] || arch=90
fi

# An installed CUDA 12 or 13 toolkit is used as it is (no network needed);
# otherwise cuda-lib.sh fetches the wheels.
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null 2>&1; then
	v=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
	if [ "${v:-0}" -ge 12 ]; then
		CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
		export CUDA_HOME
	fi
fi
say "CUDA toolkit: ${CUDA_HOME:-the PyPI wheels (scripts/cuda-lib.sh)}"

# 2. Builds: the CPU binary (the baseline, and the refusal check) and the CUDA one.
t0=$(date +%s)
make -s build >/dev/null
cpu_bin=$root/.bin/shardd
say "CPU build: $cpu_bin"
if [ "$dry" = 1 ]; then
	CUDA_ARCHS=$arch scripts/cuda-lib.sh --dry-run | sed 's/^/  cuda-lib: /' | tee -a "$summary"
	gen=$out/gen.gguf
	"$cpu_bin" gen-model --preset tiny --out "$gen" >/dev/null
	# Without a GPU the worker refuses --gpu-layers, naming why.
	if msg=$("$cpu_bin" serve --model "$gen" --listen 127.0.0.1:0 --gpu-layers all 2>&1); then
		echo "gpu-check: serve --gpu-layers all started without a GPU" >&2
		exit 1
	fi
	say "without a GPU, serve --gpu-layers all refuses: $(echo "$msg" | tail -1)"
fi
run "$out/build-cuda.txt" make -s build-cuda CUDA_ARCHS="$arch"
gpu_bin=$root/.bin/shardd-cuda
[ "$dry" = 1 ] || say "CUDA build for sm_$arch: $(($(date +%s) - t0)) s (both binaries)"

# 3. Split equals whole on the device.
gen=$out/bench.gguf
real=$(scripts/models.sh | sed -n 's/^smollm2 //p')
[ -f "$gen" ] || "$cpu_bin" gen-model --preset bench --out "$gen" >/dev/null
for m in "$gen" "$real"; do
	v=$out/verify-$(basename "$m" .gguf).txt
	if ! run "$v" "$gpu_bin" verify --model "$m" --shards 2,3 --gpu-layers -1; then
		say "verify $(basename "$m") on the GPU FAILED: $(tail -3 "$v")"
	elif [ "$dry" = 0 ]; then
		say "verify $(basename "$m") on the GPU: $(tail -1 "$v")"
	fi
done

# 4. The harness: route and whole model, on the GPU and on the CPU.
# The CPU workers get 4 threads each (a GPU machine has the cores).
common=(--model "$gen" --shards 2 --unsplit --sweep concurrency=1,16,64 --prompt-len 128 --output-len 64
	--requests 64 --warmup 8 --quiet)
run "$out/gpu.txt" "$gpu_bin" bench "${common[@]}" --serve-args "--gpu-layers all" \
	--json "$out/gpu.json" --html "$out/gpu.html"
run "$out/cpu.txt" "$cpu_bin" bench "${common[@]}" --threads 4 --unsplit-threads 4 \
	--json "$out/cpu.json" --html "$out/cpu.html"

# 5. The figures.
if [ "$dry" = 0 ]; then
	for f in gpu cpu; do
		say "$f runs:"
		python3 - "$out/$f.json" <<'EOF' | tee -a "$summary"
import json, sys
r = json.load(open(sys.argv[1]))
for s in r["runs"]:
    print(f'  {s["target"]:8s} c={s.get("concurrency", "?"):>3} {s["output_tokens_per_s"]:9.1f} tok/s  '
          f'TTFT p50 {s["ttft"]["p50_ms"]:8.1f} ms  ITL p50 {s["itl"]["p50_ms"]:6.2f} ms')
EOF
	done
fi
say "results in $out"
