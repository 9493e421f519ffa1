#!/usr/bin/env bash
# make demo-real: a real checkpoint through a route of shardd workers.
#   demo-real.sh SHARDD_BINARY WORK_DIR MODEL SHARDS [PROMPT]
# MODEL is smollm2 (SmolLM2-135M-Instruct, Q4_1) or gemma3 (Gemma 3 270M,
# Q4_K_M), fetched by scripts/models.sh. Splits it into SHARDS ranges,
# serves each with its own shardd on loopback, asks PROMPT as a chat
# message (the model's own chat template; Gemma 3's file is the base model
# and carries none, so it is asked in a plain Q:/A: transcript), streams the
# answer as text, and checks every token against the whole model run in the
# head's process ("match"), then stops the workers.
set -euo pipefail
bin=$1
dir=$2
model=$3
shards_n=$4
prompt=${5:-"What is the capital of France?"}
here=$(dirname "$0")
mkdir -p "$dir"
rm -f "$dir"/*.log

whole=$("$here/models.sh" | sed -n "s/^$model //p")
if [ -z "$whole" ]; then
  echo "demo-real: unknown model $model (smollm2, gemma3)"; exit 2
fi

echo "demo-real: splitting $(basename "$whole") into $shards_n"
mapfile -t shards < <("$bin" split --quiet --model "$whole" --shards "$shards_n" --out-dir "$dir")

. "$here/workers.sh"
for shard in "${shards[@]}"; do
  start_worker "$bin" "$shard" "$dir/$(basename "$shard" .gguf).log"
done

route=$(IFS=,; echo "${addrs[*]}")
echo "demo-real: asking through $route: $prompt"
"$bin" generate --route "$route" --chat --prompt "$prompt" --max-tokens 96 \
  --tokenizer "${shards[0]}" --verify-model "$whole"
