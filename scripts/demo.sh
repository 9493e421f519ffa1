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

pids=()
cleanup() {
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
}
trap cleanup EXIT

addrs=()
for shard in "${shards[@]}"; do
  log="$dir/$(basename "$shard" .gguf).log"
  "$bin" serve --model "$shard" --listen 127.0.0.1:0 >"$log" 2>&1 &
  pids+=($!)
  addr=""
  for _ in $(seq 1 300); do
    addr=$(sed -n 's/^shardd: listening on //p' "$log")
    [ -n "$addr" ] && break
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then
      echo "demo: the worker for $shard exited:"; cat "$log"; exit 1
    fi
    sleep 0.1
  done
  if [ -z "$addr" ]; then
    echo "demo: the worker for $shard did not start:"; cat "$log"; exit 1
  fi
  echo "demo: $(basename "$shard") served on $addr"
  addrs+=("$addr")
done

route=$(IFS=,; echo "${addrs[*]}")
echo "demo: generating 16 tokens through $route"
"$bin" generate --route "$route" --prompt-tokens 1,17,42,7,99 --max-tokens 16 --verify-model "$dir/tiny.gguf"
