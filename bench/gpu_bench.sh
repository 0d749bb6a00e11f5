#!/usr/bin/env bash
# The single-GPU benchmark: megatron.cpp on the reference shape (Llama 1.1B: hidden 2048,
# 22 layers, 32 heads, 4 query groups, ffn 5632, vocab 32000, seq 2048, micro-batch 4, bf16)
# next to the HF transformers baseline (eager and torch.compile), same machine, same call.
# megatron.cpp runs twice: the eager step, and the step replayed as a CUDA graph
# (--cuda-graph-impl local).
#   bash bench/gpu_bench.sh MEGATRON_BINARY PYTHON HF_BASELINE_SCRIPT [extra train flags]
# BENCH_SEQ=8192 runs both at another sequence length (same micro-batch).
set -uo pipefail
bin=$1; py=$2; baseline=$3
iters=${BENCH_ITERS:-30}
seq=${BENCH_SEQ:-2048}
ours() {  # train flags -> megatron.cpp's log (also on stderr)
  "$bin" train --config examples/llama-1.1b-bench.yaml --mock-data --train-iters "$iters" --log-interval 10 \
    --seq-length "$seq" --max-position-embeddings "$seq" "$@" 2>&1 | tee /dev/stderr
}
eager_log=$(ours "${@:4}")
graph_log=$(ours "${@:4}" --cuda-graph-impl local)
eager=$(PYTHONUNBUFFERED=1 "$py" "$baseline" --seq "$seq" --iters 10 2>&1 | tail -1)
compiled=$(PYTHONUNBUFFERED=1 "$py" "$baseline" --seq "$seq" --compile --iters 10 2>&1 | tail -1)
echo "$eager"; echo "$compiled"
eager_tok=$(sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p' <<< "$eager")
compiled_tok=$(sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p' <<< "$compiled")
eager_mem=$(sed -n 's/.*peak mem \([0-9.]*\) GiB.*/\1/p' <<< "$eager")
compiled_mem=$(sed -n 's/.*peak mem \([0-9.]*\) GiB.*/\1/p' <<< "$compiled")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
row() {  # name log -> a table row from the last log interval
  local last tok mfu tflops mem
  last=$(grep " iteration" <<< "$2" | tail -1)
  tok=$(sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$last")
  mfu=$(sed -n 's/.*MFU: \([0-9.]*\)%.*/\1/p' <<< "$last")
  tflops=$(sed -n 's/.*TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$last")
  mem=$(sed -n 's/.*max allocated: \([0-9.]*\).*/\1/p' <<< "$2" | head -1)
  mem=$(awk -v m="$mem" 'BEGIN { if (m != "") printf "%.1f", m / 1024; else print "n/a" }')
  printf '| %s | %s | %s | %s%% | %s | %s | %s |\n' "$1" "$tok" "$tflops" "$mfu" "$mem" \
    "$(ratio "$tok" "$eager_tok")" "$(ratio "$tok" "$compiled_tok")"
}
printf '\n| system | tokens/s/GPU | TFLOP/s/GPU | MFU | peak memory (GiB) | ratio vs eager | ratio vs compile |\n|---|---|---|---|---|---|---|\n'
row "megatron.cpp" "$eager_log"
row "megatron.cpp, CUDA graph step" "$graph_log"
printf '| HF eager | %s | | (see line above) | %s | 1.00 | |\n| HF torch.compile | %s | | (see line above) | %s | | 1.00 |\n' \
  "$eager_tok" "$eager_mem" "$compiled_tok" "$compiled_mem"
