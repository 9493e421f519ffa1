#!/usr/bin/env bash
# make side-by-side: shardd next to upstream llama.cpp's server, measured by
# one harness (shardd bench) through the OpenAI API, in interleaved rounds.
#   side-by-side.sh SHARDD_BINARY OUT_DIR MODEL SETUP [BENCH FLAGS...]
# MODEL: smollm2 or gemma3 (scripts/models.sh). SETUP:
#   one    one shardd worker (1 thread, CPU 1) behind `shardd api`, against
#          `llama-server -np 32 -t 1` on CPU 1;
#   route  a two-worker route (cut by `split --by cost` unless
#          SHARDD_SPLIT_ARGS says otherwise, 1 thread each,
#          CPUs 0 and 1) behind
#          `shardd api`, against `llama-server --rpc` over two
#          `ggml-rpc-server -t 1` on CPUs 0 and 1: llama.cpp's own split.
# The route itself (`bench --route`, compact logits as the API asks) is a
# third target on the same workers: the front door's cost. CPUs alike: in
# `one`, the worker, `shardd api` and llama-server (its HTTP threads are
# in its process) on CPU 1, the harness on CPU 0; in `route`, the heads
# (`shardd api`, llama-server) and the harness on both. Prefix and
# prompt caches are off on both sides (the rounds resend the same prompts).
# llama.cpp comes from scripts/upstream-llama.sh (llama-cpp-python 0.3.36's
# vendored tree). Writes OUT_DIR/MODEL-SETUP.json and the logs.
set -euo pipefail
bin=$1 out=$2 model=$3 setup=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
whole=$("$here/models.sh" | sed -n "s/^$model //p")
[ -n "$whole" ] || { echo "side-by-side: unknown model $model (smollm2, gemma3)" >&2; exit 2; }
up=$("$here/upstream-llama.sh")
# --no-repack where upstream's repacked weights die on this CPU (on a line
# of its own, so that a failed probe stops the script).
repack=$("$here/upstream-repack.sh" "$whole")
read -ra up_flags <<<"$repack"
ctx=8192
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# free_port: a port nothing listens on.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# wait_http URL: until it answers 200 (2 minutes at most).
wait_http() {
  for _ in $(seq 600); do curl -sf -o /dev/null "$1" && return 0; sleep 0.2; done
  echo "side-by-side: $1 never answered" >&2; exit 1
}
# start CPUS LOG CMD...: run CMD pinned to CPUS in the background.
start() { local cpus=$1 log=$2; shift 2; taskset -c "$cpus" "$@" >"$log" 2>&1 & pids+=($!); }

# SHARDD_SERVE_ARGS: more flags for every worker (e.g. --decode-budget 1s).
# SHARDD_SPLIT_ARGS: the route's cut (default --shards 2 --by cost; e.g.
# --ranges 0:14,14:18).
read -ra extra_serve <<<"${SHARDD_SERVE_ARGS:-}"
read -ra split_args <<<"${SHARDD_SPLIT_ARGS:---shards 2 --by cost}"
serve_args=(--threads 1 --max-sessions 40 --ctx-tokens $ctx --prefix-cache-bytes 0 "${extra_serve[@]}")
workers=()
case $setup in
one)
  p=$(free_port); start 1 "$out/$model-$setup-worker.log" "$bin" serve --model "$whole" --listen 127.0.0.1:$p "${serve_args[@]}"
  workers=(127.0.0.1:$p)
  lp=$(free_port)
  start 1 "$out/$model-$setup-llama-server.log" "$up/llama-server" -m "$whole" --host 127.0.0.1 --port $lp \
    -np 32 -t 1 -tb 1 -c $ctx --cache-ram 0 --no-cache-prompt --no-webui "${up_flags[@]}"
  tok=$whole
  head_cpus=1 bench_cpus=0
  ;;
route)
  mapfile -t shards < <("$bin" split --quiet --model "$whole" "${split_args[@]}" --out-dir "$out/shards-$model")
  for i in 0 1; do
    p=$(free_port); start $i "$out/$model-$setup-worker$i.log" "$bin" serve --model "${shards[$i]}" --listen 127.0.0.1:$p "${serve_args[@]}"
    workers+=(127.0.0.1:$p)
  done
  rpc=()
  for i in 0 1; do
    p=$(free_port); start $i "$out/$model-$setup-rpc$i.log" "$up/ggml-rpc-server" -t 1 -H 127.0.0.1 -p $p
    rpc+=(127.0.0.1:$p)
  done
  sleep 1
  lp=$(free_port)
  start 0,1 "$out/$model-$setup-llama-server.log" "$up/llama-server" -m "$whole" --host 127.0.0.1 --port $lp \
    --rpc "$(IFS=,; echo "${rpc[*]}")" -ngl 999 -np 32 -t 1 -tb 1 -c $ctx --cache-ram 0 --no-cache-prompt --no-webui "${up_flags[@]}"
  tok=${shards[0]}
  head_cpus=0,1 bench_cpus=0,1
  ;;
*) echo "side-by-side: SETUP is one or route" >&2; exit 2 ;;
esac
route=$(IFS=,; echo "${workers[*]}")
for w in "${workers[@]}"; do
  for _ in $(seq 300); do (exec 3<>/dev/tcp/${w%:*}/${w#*:}) 2>/dev/null && break; sleep 0.2; done
done
ap=$(free_port)
start $head_cpus "$out/$model-$setup-api.log" "$bin" api --route "$route" --tokenizer "$tok" --listen 127.0.0.1:$ap --max-inflight 64
wait_http http://127.0.0.1:$ap/health
wait_http http://127.0.0.1:$lp/health
echo "side-by-side: $model $setup: route $route, shardd api :$ap, llama-server :$lp" >&2
taskset -c $bench_cpus "$bin" bench --route "$route" --compact-logits on \
  --openai "shardd-api=http://127.0.0.1:$ap" --openai "llama-server=http://127.0.0.1:$lp" \
  --json "$out/$model-$setup.json" --quiet "$@"
