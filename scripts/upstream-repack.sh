#!/usr/bin/env bash
# upstream-repack.sh MODEL: prints the flag upstream's tools need on this
# machine to run MODEL: nothing, or --no-repack where upstream's repacked
# weights die. The October 2026 tree's AMX path (ggml-cpu/amx: repacked
# Q4_0, Q4_1, Q8_0 and K-quant weights on CPUs with AMX-INT8) faults with
# SIGILL on some hosts: an Intel Xeon with AMX (12-05) dies at `tilezero`
# in tinygemm_kernel_amx on its first forward (llama.cpp PR 26954: the
# tile config is optimised away, and worker threads never ask for the tile
# state). shardd never repacks (backend/llamacpp/shim.c), so it is not
# affected. One 8-token forward of upstream's llama-batched-bench tells;
# the verdict is cached beside the build, per model file.
set -euo pipefail
model=$1
here=$(cd "$(dirname "$0")" && pwd)
up=$("$here/upstream-llama.sh")
cache="$up/../repack-probe"
mkdir -p "$cache"
key=$(printf '%s|%s' "$(readlink -f "$model")" "$(stat -c %s "$model")" | sha256sum | cut -c1-16)
if [ ! -f "$cache/$key" ]; then
  rc=0
  # (the braces keep the shell's own "Illegal instruction" line quiet)
  { "$up/llama-batched-bench" -m "$model" -t 1 -tb 1 -c 256 -npp 8 -ntg 1 -npl 1 \
    >"$cache/$key.log" 2>&1 || rc=$?; } 2>/dev/null
  case $rc in
  0) : >"$cache/$key" ;;
  132)
    echo "upstream-repack: upstream's repacked weights die of SIGILL on this CPU ($model): its runs get --no-repack" >&2
    echo --no-repack >"$cache/$key"
    ;;
  *)
    echo "upstream-repack: llama-batched-bench failed ($rc) on $model; see $cache/$key.log" >&2
    exit 1
    ;;
  esac
fi
cat "$cache/$key"
