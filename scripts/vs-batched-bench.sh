#!/usr/bin/env bash
# make vs-upstream: shardd (its backend on the pinned llama.cpp, patched)
# next to upstream's llama-batched-bench built from the same October 2026
# tree (llama-cpp-python 0.3.36's vendor/llama.cpp, scripts/upstream-llama.sh)
# on the same batched forwards, in interleaved rounds (issue 44).
#   vs-batched-bench.sh OUT_DIR ROUNDS THREADS MODEL...
# MODEL: smollm2, gemma3 (scripts/models.sh) or a GGUF path. Per round and
# model, one after the other on the same CPUs:
#   upstream  llama-batched-bench -npp 8 -ntg 64 -npl 1,16,32 -t THREADS
#             (--no-repack where its repacked weights die on this CPU:
#             scripts/upstream-repack.sh)
#   shardd    BenchmarkDecodeCeiling (bench/ceiling_test.go), sessions 1,
#             16 and 32 of 8-token prompts and 64 tokens: the same batches
#             through shardd's backend in the process ("inproc"), and
#             through one worker over gRPC behind the route client
#             ("worker").
# Both run on CPU 1 with THREADS 1, on CPUs 0-1 with THREADS 2. Tokens/s
# are generated tokens over the whole run (prompt included) and over the
# decode phase alone. Writes OUT_DIR/rows.tsv (round, model, side,
# sessions, total tok/s, decode tok/s) and prints the medians and ratios.
set -euo pipefail
out=$1 rounds=$2 threads=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
mkdir -p "$out"
up=$("$here/upstream-llama.sh")
cpus=1
[ "$threads" -ge 2 ] && cpus=0-$((threads - 1))
test_bin="$out/bench.test"
(cd "$root" && go test -c -o "$test_bin" ./bench)
models=()
for m in "$@"; do
  p=$("$here/model-path.sh" "$m")
  models+=("$p")
done
rows="$out/rows.tsv"
: >"$rows"
for r in $(seq "$rounds"); do
  for m in "${models[@]}"; do
    name=$(basename "$m" .gguf)
    # Each side starts with the model in the page cache. A host that runs
    # DAMON with a pageout scheme (this project's VMs) drops a file's
    # unmapped pages after a minute cold, so the side that ran first after
    # the other model's turn read its weights from disk inside its first
    # timed forward (upstream's one-session Gemma 3: 47-54 tokens/s so,
    # 51-62 with the file in the page cache, alternating).
    cat "$m" >/dev/null
    # upstream: | PP | TG | B | N_KV | T_PP | S_PP | T_TG | S_TG | T | S |
    repack=$("$here/upstream-repack.sh" "$m") # --no-repack or nothing
    # shellcheck disable=SC2086 # one flag or none
    taskset -c $cpus "$up/llama-batched-bench" -m "$m" -t "$threads" -tb "$threads" -c 2400 -b 512 -ub 512 \
      -npp 8 -ntg 64 -npl 1,16,32 $repack >"$out/upstream-$name-$r.log" 2>&1
    awk -F'|' -v r="$r" -v m="$name" 'NF > 10 && $2 ~ /^ *8 *$/ {
      b = $4 + 0; tg = $3 + 0; printf "%s\t%s\tupstream\t%d\t%.1f\t%.1f\n", r, m, b, b * tg / $10, $9 }' \
      "$out/upstream-$name-$r.log" >>"$rows"
    cat "$m" >/dev/null
    SHARDD_BENCH_MODEL=$m SHARDD_BENCH_THREADS=$threads taskset -c $cpus "$test_bin" -test.run '^$' \
      -test.bench 'DecodeCeiling/sessions=(1|16|32)$' -test.benchtime 1x >"$out/shardd-$name-$r.log" 2>&1
    awk -v r="$r" -v m="$name" '/^BenchmarkDecodeCeiling/ {
      split($1, a, "="); n = a[2] + 0
      for (i = 2; i < NF; i++) v[$(i + 1)] = $i
      printf "%s\t%s\tinproc\t%d\t%.1f\t%.1f\n", r, m, n, v["inproc-tok/s"], v["inproc-decode-tok/s"]
      printf "%s\t%s\tworker\t%d\t%.1f\t%.1f\n", r, m, n, v["worker-tok/s"], v["worker-decode-tok/s"] }' \
      "$out/shardd-$name-$r.log" >>"$rows"
  done
done
python3 - "$rows" <<'EOF'
import collections, statistics, sys
v = collections.defaultdict(dict)  # (model, sessions, side) -> round -> (total, decode)
for line in open(sys.argv[1]):
    r, m, side, n, tot, dec = line.split("\t")
    v[(m, int(n), side)][r] = (float(tot), float(dec))
def ratio(m, n, side, i):
    """The median over rounds of side / upstream, each round's pair."""
    up, s = v[(m, n, "upstream")], v[(m, n, side)]
    return statistics.median(s[r][i] / up[r][i] for r in up if r in s)
print(f"{'model':40} {'sessions':>8} {'upstream tok/s':>16} {'inproc':>16} {'worker':>16} {'inproc/up':>10} {'worker/up':>10}  (total; decode; ratios: medians of each round's)")
for m, n in sorted({(k[0], k[1]) for k in v}):
    if not all(v[(m, n, s)] for s in ("upstream", "inproc", "worker")):
        continue
    med = {s: tuple(statistics.median(x[i] for x in v[(m, n, s)].values()) for i in (0, 1))
           for s in ("upstream", "inproc", "worker")}
    u, i, w = med["upstream"], med["inproc"], med["worker"]
    print(f"{m:40} {n:>8} {u[0]:7.1f}; {u[1]:7.1f} {i[0]:7.1f}; {i[1]:7.1f} {w[0]:7.1f}; {w[1]:7.1f}"
          f" {ratio(m, n, 'inproc', 0):5.2f};{ratio(m, n, 'inproc', 1):5.2f} {ratio(m, n, 'worker', 0):5.2f};{ratio(m, n, 'worker', 1):5.2f}")
EOF
