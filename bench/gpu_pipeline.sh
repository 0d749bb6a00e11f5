#!/usr/bin/env bash
# Pipeline parallelism on two GPUs (device kind nvidia-h200-x2), from the repository root:
#   bash bench/gpu_pipeline.sh MEGATRON_BINARY
# 1. Equivalence under NCCL in bf16: a small Llama-shaped model trained 20 steps under PP=2 (1F1B)
#    and PP=2 with 2 virtual stages must give the 1-GPU bf16 losses within BENCH_BF16_TOLERANCE
#    (relative, per step; default 2e-2).
# 2. The bubble: the 1.1B reference shape (22 layers) on 1 GPU and under PP=2 with 8 and 16
#    micro-batches; a 24-layer variant (divisible into 2 x 2 chunks) on 1 GPU, PP=2 and PP=2
#    interleaved with 8 micro-batches. Measured bubble = 1 - (tokens/s/GPU under PP=2) /
#    (tokens/s on 1 GPU), which also carries the P2P transfers; theory (p-1)/(m+p-1), and
#    (p-1)/(v*m+p-1) interleaved. Peak memory per stage from the trainer's memory report.
set -uo pipefail
bin=$1
tolerance=${BENCH_BF16_TOLERANCE:-2e-2}
iters=${BENCH_ITERS:-20}
work=$(mktemp -d)
status=0

source "$(dirname "$0")/lib.sh"

echo "== pipeline equivalence under NCCL, bf16, 20 steps (tolerance $tolerance relative)"
run_small single 1
printf '| layout | max relative loss difference vs 1 GPU | steps | verdict |\n|---|---|---|---|\n'
for layout in "pp2:--pipeline-model-parallel-size 2" "pp2_interleaved:--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2" \
              "pp2_untied:--pipeline-model-parallel-size 2 --untie-embeddings-and-output-weights"; do
  name=${layout%%:*}; flags=${layout#*:}
  [ "$name" = pp2_untied ] && run_small single_untied 1 --untie-embeddings-and-output-weights
  # shellcheck disable=SC2086
  run_small "$name" 2 $flags
  reference=$work/single.jsonl; [ "$name" = pp2_untied ] && reference=$work/single_untied.jsonl
  read -r diff steps <<< "$(max_relative "$work/$name.jsonl" "$reference")"
  verdict=$(awk -v d="$diff" -v t="$tolerance" -v n="$steps" 'BEGIN { print (n == 20 && d <= t) ? "ok" : "FAIL" }')
  [ "$verdict" = ok ] || status=1
  printf '| %s | %s | %s | %s |\n' "$name" "$diff" "$steps" "$verdict"
done

echo; echo "== pipeline bubble, 1.1B shape (micro-batch 4, seq 2048, bf16), $iters iterations"
row() {  # label layers m v tokens baseline
  awk -v l="$1" -v L="$2" -v m="$3" -v v="$4" -v t="$5" -v b="$6" 'BEGIN {
    p = 2; theory = (p - 1) / (v * m + p - 1);
    if (t > 0 && b > 0) printf "| %s | %d | %d | %d | %.0f | %.1f%% | %.1f%% |\n", l, L, m, v, t, 100 * (1 - t / b), 100 * theory;
    else printf "| %s | %d | %d | %d | n/a | n/a | %.1f%% |\n", l, L, m, v, 100 * theory }'
}
one22=$(bench gpu1_22 1 32)
pp8=$(bench pp2_m8 2 32 --pipeline-model-parallel-size 2)
pp16=$(bench pp2_m16 2 64 --pipeline-model-parallel-size 2)
one24=$(bench gpu1_24 1 32 --num-layers 24)
pp24=$(bench pp2_24_m8 2 32 --num-layers 24 --pipeline-model-parallel-size 2)
vpp24=$(bench pp2_24_m8_v2 2 32 --num-layers 24 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2)
printf '| run | layers | micro-batches m | virtual stages v | tokens/s/GPU | measured bubble (1 - PP/1 GPU) | theory (p-1)/(v m+p-1) |\n|---|---|---|---|---|---|---|\n'
printf '| 1 GPU | 22 | 8 | - | %s | - | - |\n' "$one22"
row "PP=2 1F1B" 22 8 1 "$pp8" "$one22"
row "PP=2 1F1B" 22 16 1 "$pp16" "$one22"
printf '| 1 GPU | 24 | 8 | - | %s | - | - |\n' "$one24"
row "PP=2 1F1B" 24 8 1 "$pp24" "$one24"
row "PP=2 interleaved" 24 8 2 "$vpp24" "$one24"
for f in "$work"/*.log; do
  echo "--- $(basename "$f"): $(grep -m1 'parallel layout' "$f")"
  grep " iteration" "$f" | tail -1
  grep "memory (MB)" "$f"
done
rm -rf "$work"
exit $status
