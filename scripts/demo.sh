#!/usr/bin/env bash
# make demo: a real route on the embedded default (tiny) model.
#   demo.sh SHARDD_BINARY WORK_DIR
# Generates the tiny model, splits it in two, starts one shardd per shard on
# loopback, generates through the route, checks the tokens equal the unsplit
# model's ("match"), and stops the workers.
set -euo pipefail
bin=$1
dir=$2
mkdir -p "$dir"
rm -f "$dir"/*.log

echo "demo: generating the tiny model"
"$bin" gen-model --preset tiny --out "$dir/tiny.gguf"
echo "demo: splitting it in two"
mapfile -t shards < <("$bin" split --quiet --model "$dir/tiny.gguf" --shards 2 --out-dir "$dir")

. "$(dirname "$0")/workers.sh"
for shard in "${shards[@]}"; do
  start_worker "$bin" "$shard" "$dir/$(basename "$shard" .gguf).log"
done

route=$(IFS=,; echo "${addrs[*]}")
echo "demo: generating 16 tokens through $route"
"$bin" generate --route "$route" --prompt-tokens 1,17,42,7,99 --max-tokens 16 --verify-model "$dir/tiny.gguf"
