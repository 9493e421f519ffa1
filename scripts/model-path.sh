#!/usr/bin/env bash
# model-path.sh MODEL: the GGUF a script's MODEL argument names: a path as
# given, or a name scripts/models.sh knows (smollm2, gemma3; fetched once).
# Exits 2, saying so, for anything else.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ -f "$1" ]; then
  echo "$1"
  exit 0
fi
p=$("$here/models.sh" | sed -n "s/^$1 //p")
[ -n "$p" ] || { echo "$(basename "$0"): unknown model $1 (a GGUF path, or a name models.sh knows)" >&2; exit 2; }
echo "$p"
