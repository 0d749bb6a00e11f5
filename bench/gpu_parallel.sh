#!/usr/bin/env bash
# Two-GPU runs (device kind nvidia-h200-x2), from the repository root:
#   bash bench/gpu_parallel.sh MEGATRON_BINARY PYTHON HF_BASELINE_SCRIPT
# 1. Parallel equivalence under NCCL in bf16: a small Llama-shaped model trained 20 steps under
#    TP=2, TP=2 + SP, DP=2, DP=2 + distributed optimizer and TP=2 with overlapped buckets must
#    give the 1-GPU bf16 losses within BF16_TOLERANCE (relative, per step; default 2e-2).
# 2. The 1.1B reference shape (examples/llama-1.1b-bench.yaml): tokens/s/GPU on 1 GPU, DP=2
#    (with and without the distributed optimizer) and TP=2 (with and without SP), and the
#    scaling efficiency of each against 1 GPU; the HF eager baseline on 1 GPU beside them.
set -uo pipefail
bin=$1; py=$2; baseline=$3
tolerance=${BENCH_BF16_TOLERANCE:-2e-2}
iters=${BENCH_ITERS:-30}
work=$(mktemp -d)
status=0

source "$(dirname "$0")/lib.sh"
small+=(--untie-embeddings-and-output-weights)

echo "== parallel equivalence under NCCL, bf16, 20 steps (tolerance $tolerance relative)"
run_small single 1
printf '| layout | max relative loss difference vs 1 GPU | steps | verdict |\n|---|---|---|---|\n'
for layout in "tp2:--tensor-model-parallel-size 2" "tp2_sp:--tensor-model-parallel-size 2 --sequence-parallel" \
              "dp2:" "dp2_distopt:--use-distributed-optimizer" \
              "dp2_distopt_overlap:--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 1000000"; do
  name=${layout%%:*}; flags=${layout#*:}
  # shellcheck disable=SC2086
  run_small "$name" 2 $flags
  read -r diff steps <<< "$(max_relative "$work/$name.jsonl" "$work/single.jsonl")"
  verdict=$(awk -v d="$diff" -v t="$tolerance" -v n="$steps" 'BEGIN { print (n == 20 && d <= t) ? "ok" : "FAIL" }')
  [ "$verdict" = ok ] || status=1
  printf '| %s | %s | %s | %s |\n' "$name" "$diff" "$steps" "$verdict"
done

echo; echo "== 1.1B reference shape, $iters iterations"
one=$(bench gpu1 1 4)
eager=$(PYTHONUNBUFFERED=1 "$py" "$baseline" --iters 10 2>&1 | tail -1 | sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p')
printf '| layout | GPUs | global batch | tokens/s/GPU | scaling efficiency vs 1 GPU |\n|---|---|---|---|---|\n'
printf '| HF eager baseline | 1 | 4 | %s | |\n| megatron.cpp | 1 | 4 | %s | 1.00 |\n' "$eager" "$one"
for layout in "DP=2:8:--overlap-grad-reduce" "DP=2 distributed optimizer:8:--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather" \
              "TP=2:4:--tensor-model-parallel-size 2" "TP=2 + SP:4:--tensor-model-parallel-size 2 --sequence-parallel"; do
  name=${layout%%:*}; rest=${layout#*:}; gbs=${rest%%:*}; flags=${rest#*:}
  # shellcheck disable=SC2086
  tok=$(bench "$(tr -c 'A-Za-z0-9' _ <<< "$name")" 2 "$gbs" $flags)
  printf '| megatron.cpp %s | 2 | %s | %s | %s |\n' "$name" "$gbs" "$tok" \
    "$(awk -v a="$tok" -v b="$one" 'BEGIN { if (b > 0 && a > 0) printf "%.3f", a / b; else print "n/a" }')"
done
for f in "$work"/*.log; do echo "--- $(basename "$f"): $(grep -m1 'parallel layout' "$f")"; grep " iteration" "$f" | tail -1; done
rm -rf "$work"
exit $status
