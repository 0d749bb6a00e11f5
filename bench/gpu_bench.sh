#!/usr/bin/env bash
# The single-GPU benchmark: megatron.cpp on the reference shape (Llama 1.1B: hidden 2048,
# 22 layers, 32 heads, 4 query groups, ffn 5632, vocab 32000, seq 2048, micro-batch 4, bf16)
# next to the HF transformers baseline (eager and torch.compile), same machine, same call.
#   bash bench/gpu_bench.sh MEGATRON_BINARY PYTHON HF_BASELINE_SCRIPT [extra train flags]
# BENCH_SEQ=8192 runs both at another sequence length (same micro-batch).
set -uo pipefail
bin=$1; py=$2; baseline=$3
iters=${BENCH_ITERS:-30}
seq=${BENCH_SEQ:-2048}
log=$("$bin" train --config examples/llama-1.1b-bench.yaml --mock-data --train-iters "$iters" --log-interval 10 \
        --seq-length "$seq" --max-position-embeddings "$seq" "${@:4}" 2>&1 | tee /dev/stderr)
ours=$(grep " iteration" <<< "$log" | tail -1)
ours_mem=$(sed -n 's/.*max allocated: \([0-9.]*\).*/\1/p' <<< "$log" | head -1)
eager=$(PYTHONUNBUFFERED=1 "$py" "$baseline" --seq "$seq" --iters 10 2>&1 | tail -1)
compiled=$(PYTHONUNBUFFERED=1 "$py" "$baseline" --seq "$seq" --compile --iters 10 2>&1 | tail -1)
echo "$eager"; echo "$compiled"
ours_tok=$(sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$ours")
ours_mfu=$(sed -n 's/.*MFU: \([0-9.]*\)%.*/\1/p' <<< "$ours")
ours_tflops=$(sed -n 's/.*TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$ours")
eager_tok=$(sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p' <<< "$eager")
compiled_tok=$(sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p' <<< "$compiled")
eager_mem=$(sed -n 's/.*peak mem \([0-9.]*\) GiB.*/\1/p' <<< "$eager")
compiled_mem=$(sed -n 's/.*peak mem \([0-9.]*\) GiB.*/\1/p' <<< "$compiled")
ours_gib=$(awk -v m="$ours_mem" 'BEGIN { if (m != "") printf "%.1f", m / 1024; else print "n/a" }')
printf '\n| system | tokens/s/GPU | TFLOP/s/GPU | MFU | peak memory (GiB) | ratio vs eager | ratio vs compile |\n|---|---|---|---|---|---|---|\n'
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
printf '| megatron.cpp | %s | %s | %s%% | %s | %s | %s |\n' "$ours_tok" "$ours_tflops" "$ours_mfu" "$ours_gib" \
  "$(ratio "$ours_tok" "$eager_tok")" "$(ratio "$ours_tok" "$compiled_tok")"
printf '| HF eager | %s | | (see line above) | %s | 1.00 | |\n| HF torch.compile | %s | | (see line above) | %s | | 1.00 |\n' \
  "$eager_tok" "$eager_mem" "$compiled_tok" "$compiled_mem"
