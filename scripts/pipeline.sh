#!/usr/bin/env bash
# make pipeline: issue 44's pipeline rows in one command. A 2-hop route,
# one thread and one CPU a hop, against the whole model on one thread, at
# 32 sessions of 8-token prompts and 64 tokens, in interleaved rounds, with
# the ceiling read in the same rounds (shardd bench --ceiling):
#   pipeline.sh SHARDD OUT_DIR ROUNDS
#   bench preset (generated, bf16)  --ranges 0:8,8:12   12 s rounds
#   SmolLM2-135M Q4_1               --ranges 0:18,18:30  20 s rounds
# (the cuts split --by time --kv-cells 72 gives at 16 rows on 1 thread).
# Writes OUT_DIR/MODEL.txt and OUT_DIR/MODEL.json (the harness's reports)
# and prints each model's ratio, ceiling and share, how far the host's
# memory read speed moved in each round, the pace the route's cores
# allowed against the whole model's, and the probes. Needs 2 CPUs.
set -euo pipefail
bin=$1 out=$2 rounds=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
preset="$out/bench.gguf"
[ -f "$preset" ] || "$bin" gen-model --preset bench --out "$preset" >/dev/null
smol=$("$here/model-path.sh" smollm2)
run() { # NAME MODEL RANGES DURATION
  "$bin" bench --model "$2" --ranges "$3" --threads 1 --worker-cpus '0;1' --unsplit --unsplit-threads 1 \
    --unsplit-cpus 0 --ceiling --concurrency 32 --duration "$4" --prompt-len 8 --output-len 64 \
    --rounds "$rounds" --warmup 64 --compact-logits on --quiet --json "$out/$1.json" >"$out/$1.txt" 2>&1
  echo "== $1 ($3): route / whole, its ceiling, the share"
  sed -n '/^pipeline ceiling/,/median/p' "$out/$1.txt"
  grep '^host: memory\|^host: each run' "$out/$1.txt" || true
}
run bench-preset "$preset" 0:8,8:12 12s
run smollm2 "$smol" 0:18,18:30 20s
