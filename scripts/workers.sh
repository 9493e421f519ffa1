# Sourced by the demo scripts: start shardd workers on loopback and stop
# them on exit.
#   start_worker BIN SHARD LOG [serve flags...]   appends the address to addrs
pids=()
addrs=()
stop_workers() {
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
  fi
}
trap stop_workers EXIT

start_worker() {
  local bin=$1 shard=$2 log=$3; shift 3
  "$bin" serve --model "$shard" --listen 127.0.0.1:0 "$@" >"$log" 2>&1 &
  pids+=($!)
  local addr=""
  for _ in $(seq 1 600); do
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
}
