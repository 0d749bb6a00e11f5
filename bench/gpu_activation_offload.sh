#!/usr/bin/env bash
# What --cpu-offloading costs and saves on issue #24's 2B Qwen3-sized shape (bench/gpu_memory.sh's,
# with the precision-aware optimizer's bf16 state): the same run keeping every activation, then
# with the first 7, 14 and 27 of the 28 layers' activations sent to host memory. Tokens/s, peak
# allocated memory and the bytes each micro-batch moved, all in one call.
#   bash bench/gpu_activation_offload.sh MEGATRON_BINARY
set -uo pipefail
bin=$1
iters=${BENCH_ITERS:-20}
source "$(dirname "$0")/lib.sh"
shape=("${qwen3_2b[@]}" --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --main-grads-dtype bf16)
printf '| offloaded layers | tokens/s | vs none | peak allocated (GiB) | moved per micro-batch |\n|---|---|---|---|---|\n'
base=0
for n in 0 7 14 27; do
  flags=(); [ "$n" -gt 0 ] && flags=(--cpu-offloading-num-layers "$n")
  log=/tmp/activation_offload_$n.log
  "$bin" train "${shape[@]}" --train-iters "$iters" --log-interval 10 "${flags[@]}" > "$log" 2>&1 \
    || { echo "FAILED: $n layers"; tail -20 "$log"; continue; }
  tok=$(grep " iteration" "$log" | tail -1 | sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p')
  mem=$(grep -o 'max allocated: [0-9.]*' "$log" | head -1 | awk '{printf "%.1f", $3 / 1024}')
  moved=$(sed -n 's/.*per micro-batch: \([0-9.]* MB\).*/\1/p' "$log" | head -1)
  [ "$n" -eq 0 ] && base=$tok
  printf '| %s | %s | %s | %s | %s |\n' "$n" "$tok" "$(awk -v a="$tok" -v b="$base" 'BEGIN { if (b > 0) printf "%.3fx", a / b }')" "$mem" "${moved:--}"
done
