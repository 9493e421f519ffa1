#!/usr/bin/env bash
# Where a decode step's time goes (issue 44): one worker serving MODEL
# whole on CPU 1 (1 thread), driven by `shardd bench --route` on CPU 0
# with SESSIONS generations of 8 + 64 tokens in a closed loop; `perf
# record` samples the worker and the head for SECONDS in the middle, and
# `llama-batched-bench` (upstream, scripts/upstream-llama.sh) the same
# batch shape on CPU 1. Samples are sorted into buckets by symbol
# (scripts/step-buckets.py) and divided into per-step microseconds with
# the step count of the window.
#   step-profile.sh SHARDD_BINARY OUT_DIR MODEL SESSIONS [SECONDS]
set -euo pipefail
bin=$1 out=$2 model=$3 sessions=$4 secs=${5:-8}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
whole=$model
[ -f "$whole" ] || whole=$("$here/models.sh" | sed -n "s/^$model //p")
name=$(basename "$whole" .gguf)
up=$("$here/upstream-llama.sh")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
taskset -c 1 "$bin" serve --model "$whole" --listen 127.0.0.1:$port --threads 1 --prefix-cache-bytes 0 \
  --max-sessions 40 --metrics-listen 127.0.0.1:0 >"$out/$name-$sessions-worker.log" 2>&1 &
worker=$!
pids+=($worker)
for _ in $(seq 300); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.2; done
taskset -c 0 "$bin" bench --route 127.0.0.1:$port --tokenizer "$whole" --concurrency "$sessions" \
  --duration $((secs + 10))s --warmup "$sessions" --prompt-len 8 --output-len 64 --compact-logits on --quiet \
  --json "$out/$name-$sessions-bench.json" >"$out/$name-$sessions-bench.log" 2>&1 &
head=$!
pids+=($head)
sleep 6
perf record -q -g -o "$out/$name-$sessions-worker.perf" -p $worker -- sleep "$secs" 2>/dev/null &
pw=$!
perf record -q -g -o "$out/$name-$sessions-head.perf" -p $head -- sleep "$secs" 2>/dev/null &
ph=$!
wait $pw $ph
wait $head || true
for side in worker head; do
  perf report -i "$out/$name-$sessions-$side.perf" --no-children --sort sym --stdio -q -g none 2>/dev/null \
    >"$out/$name-$sessions-$side.txt" || true
done
# upstream, the same shape: its decode phase under perf.
perf record -q -g -o "$out/$name-$sessions-upstream.perf" -- taskset -c 1 "$up/llama-batched-bench" -m "$whole" \
  -t 1 -tb 1 -c 2400 -npp 8 -ntg 64 -npl "$sessions" >"$out/$name-$sessions-upstream.log" 2>&1
perf report -i "$out/$name-$sessions-upstream.perf" --no-children --sort sym --stdio -q -g none 2>/dev/null \
  >"$out/$name-$sessions-upstream.txt" || true
echo "$out/$name-$sessions-{worker,head,upstream}.txt"
