#!/usr/bin/env bash
# make vs-llama: shardd's llama.cpp (the pinned sdist's October 2026 tree
# as scripts/llama-lib.sh builds it, patches included) against the same
# tree unpatched as upstream builds it (scripts/upstream-llama.sh), with one
# C driver (scripts/llama-vs/decode.c) linked against each, so the figures
# differ by the library alone: no Go, no scheduler, no benchmark tool of
# either side (issue 44, "the llama.cpp underneath").
#   llama-vs.sh OUT_DIR ROUNDS MODEL...
# MODEL: smollm2, gemma3 (scripts/models.sh) or a GGUF path. Per round,
# model and session count (1, 16), one after the other on CPU 1, 1 thread:
#   pinned            the project's library
#   upstream          upstream's, its defaults
#   upstream-notiled  upstream's with its tiled K-quant matmul off
#                     (GGML_CPU_TILED_MM=0: ggml's vec_dot)
# Weight repacking is off on both sides (shardd loads without it). Prints
# the medians of the prompt forward (8 tokens a session) and of a decode
# step, in process CPU ms, and their ratios to pinned.
set -euo pipefail
out=$1 rounds=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
up=$(cd "$("$here/upstream-llama.sh")/../.." && pwd)
pinned=$("$here/llama-lib.sh")
src="$here/llama-vs/decode.c"
cc -O2 -I"$pinned/include" "$src" -o "$out/pinned" \
  "$pinned/libshardd_llama.a" -lstdc++ -lm -lpthread
uv="$up/vendor/llama.cpp" ub="$up/build"
cc -O2 -I"$uv/include" -I"$uv/ggml/include" "$src" -o "$out/upstream" "$ub/src/libllama.a" "$ub/ggml/src/libggml.a" \
  "$ub/ggml/src/ggml-rpc/libggml-rpc.a" "$ub/ggml/src/libggml-cpu.a" "$ub/ggml/src/libggml-base.a" \
  -lstdc++ -lm -lpthread -fopenmp
models=()
for m in "$@"; do
  p=$("$here/model-path.sh" "$m")
  models+=("$p")
done
rows="$out/rows.tsv"
: >"$rows"
for r in $(seq "$rounds"); do
  for m in "${models[@]}"; do
    for n in 1 16; do
      for side in pinned upstream upstream-notiled; do
        bin=$out/${side%-notiled} tiled=1
        [ "$side" = upstream-notiled ] && tiled=0
        cat "$m" >/dev/null # in the page cache for every side (vs-batched-bench.sh says why)
        GGML_CPU_TILED_MM=$tiled taskset -c 1 "$bin" "$m" 32 2 0 "$n" 2>/dev/null | tail -1 |
          awk -v r="$r" -v m="$(basename "$m" .gguf)" -v n="$n" -v s="$side" \
            '{ printf "%s\t%s\t%d\t%s\t%s\t%s\n", r, m, n, s, $5, $11 }' >>"$rows"
      done
    done
  done
done
python3 - "$rows" <<'PY'
import collections, statistics, sys
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r, m, n, side, prompt, step = line.split("\t")
    v[(m, int(n), side)].append((float(prompt), float(step)))
print(f"{'model':36} {'sessions':>8} {'side':>17} {'prompt ms':>10} {'step ms':>8} {'prompt/pinned':>14} {'step/pinned':>12}")
for m, n in sorted({(k[0], k[1]) for k in v}):
    base = None
    for side in ("pinned", "upstream", "upstream-notiled"):
        if not v[(m, n, side)]:
            continue
        p = statistics.median(x for x, _ in v[(m, n, side)])
        s = statistics.median(y for _, y in v[(m, n, side)])
        base = base or (p, s)
        print(f"{m:36} {n:>8} {side:>17} {p:10.1f} {s:8.2f} {p/base[0]:14.2f} {s/base[1]:12.2f}")
PY
