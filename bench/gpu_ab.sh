#!/usr/bin/env bash
# Before / after on one GPU: two megatron.cpp binaries on the reference shape (Llama 1.1B, seq
# 2048, micro-batch 4, bf16), alternated A B A B so drift in clock or temperature hits both,
# next to the HF torch.compile baseline in the same call. Says whether a change is speed-neutral.
#   [AB_FLAGS='...'] bash bench/gpu_ab.sh BEFORE_BINARY AFTER_BINARY PYTHON HF_BASELINE_SCRIPT
# AB_FLAGS go to both binaries (e.g. '--reset-attention-mask --reset-position-ids': the mock
# documents packed, each attending only within itself).
set -uo pipefail
before=$1; after=$2; py=$3; baseline=$4
iters=${BENCH_ITERS:-30}
tokens() {  # binary -> tokens/s/GPU of the last log interval
  "$1" train --config examples/llama-1.1b-bench.yaml --mock-data --train-iters "$iters" --log-interval 10 ${AB_FLAGS:-} 2>&1 |
    grep " iteration" | tail -1 | sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p'
}
declare -a a b
for round in 1 2; do
  a+=("$(tokens "$before")"); echo "round $round before: ${a[-1]} tokens/s"
  b+=("$(tokens "$after")"); echo "round $round after:  ${b[-1]} tokens/s"
done
compiled=$("$py" "$baseline" --seq 2048 --compile --iters 10 2>&1 | tail -1)
echo "HF torch.compile: $compiled"
compiled_tok=$(sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p' <<< "$compiled")
awk -v a1="${a[0]}" -v a2="${a[1]}" -v b1="${b[0]}" -v b2="${b[1]}" -v c="$compiled_tok" 'BEGIN {
  a = (a1 + a2) / 2; b = (b1 + b2) / 2
  printf "before %.0f, after %.0f tokens/s: after / before %.4f", a, b, b / a
  if (c > 0) printf "; vs torch.compile %.2fx before, %.2fx after", a / c, b / c
  printf "\n" }'
