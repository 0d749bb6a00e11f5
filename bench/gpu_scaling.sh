#!/usr/bin/env bash
# Runs of the multi-GPU scaling issue on one host with 4 or 8 GPUs (device kinds nvidia-h200-x4 /
# -x8), from the repository root, one part per device call (each fits the 10-minute limit):
#   bash bench/gpu_scaling.sh MEGATRON_BINARY equivalence|dp|bubble|8b
# equivalence: a small Llama-shaped model trained 20 steps in bf16 under TP=4, PP=4, and
#   TP=2 x PP=2 x DP (the rest of the GPUs) with the distributed optimizer must give the 1-GPU
#   losses within BENCH_BF16_TOLERANCE (relative, per step; default 2e-2).
# dp: the 1.1B reference shape on 1, 2, 4 (and 8) GPUs, DP with the distributed optimizer and
#   overlapped reduction / gather, micro-batch 4 per GPU; scaling efficiency vs 1 GPU.
# bubble: 24 layers of the 1.1B shape, 16 micro-batches, PP=4 and PP=8 (where the GPUs allow),
#   1F1B and interleaved; measured bubble 1 - (tokens/s/GPU) / (1 GPU's) vs (p-1)/(v m+p-1).
# 8b: the Llama-3-8B shape at seq 8192 (examples/llama3-8b.yaml, micro-batch 1) under the TP x PP x
#   DP layouts that fit the GPUs, all with the distributed optimizer: tokens/s/GPU, MFU, memory.
#   BENCH_8B_LAYOUTS ("TP:PP ...") picks layouts; BENCH_8B_FLAGS adds flags to every run (e.g.
#   activation recomputation).
set -uo pipefail
bin=$1; part=$2
gpus=${BENCH_GPUS:-$(nvidia-smi -L | wc -l)}
tolerance=${BENCH_BF16_TOLERANCE:-2e-2}
iters=${BENCH_ITERS:-20}
work=$(mktemp -d)
status=0
source "$(dirname "$0")/lib.sh"
efficiency() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.3f", a / b; else print "n/a" }'; }
show_logs() {
  for f in "$work"/*.log; do
    echo "--- $(basename "$f"): $(grep -m1 'parallel layout' "$f")"
    grep " iteration" "$f" | tail -1
    grep "memory (MB)" "$f"
  done
}

case "$part" in
equivalence)
  echo "== equivalence under NCCL, bf16, 20 steps, $gpus GPUs (tolerance $tolerance relative)"
  small+=(--untie-embeddings-and-output-weights)
  run_small single 1
  printf '| layout | GPUs | max relative loss difference vs 1 GPU | steps | verdict |\n|---|---|---|---|---|\n'
  for layout in "tp4:4:--tensor-model-parallel-size 4" "tp4_sp:4:--tensor-model-parallel-size 4 --sequence-parallel" \
                "pp4:4:--pipeline-model-parallel-size 4" \
                "tp2_pp2_dp:$gpus:--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce" \
                "tp4_pp2:8:--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2"; do
    name=${layout%%:*}; rest=${layout#*:}; n=${rest%%:*}; flags=${rest#*:}
    [ "$n" -le "$gpus" ] || continue
    # shellcheck disable=SC2086
    run_small "$name" "$n" $flags
    read -r diff steps <<< "$(max_relative "$work/$name.jsonl" "$work/single.jsonl")"
    verdict=$(awk -v d="$diff" -v t="$tolerance" -v s="$steps" 'BEGIN { print (s == 20 && d <= t) ? "ok" : "FAIL" }')
    [ "$verdict" = ok ] || status=1
    printf '| %s | %s | %s | %s | %s |\n' "$name" "$n" "$diff" "$steps" "$verdict"
  done
  ;;
dp)
  echo "== DP scaling, 1.1B shape, micro-batch 4 per GPU, $iters iterations"
  one=$(bench dp1 1 4)
  printf '| GPUs | global batch | tokens/s/GPU | scaling efficiency vs 1 GPU |\n|---|---|---|---|\n| 1 | 4 | %s | 1.000 |\n' "$one"
  for n in 2 4 8; do
    [ "$n" -le "$gpus" ] || continue
    tok=$(bench "dp$n" "$n" $((4 * n)) --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather)
    printf '| %s | %s | %s | %s |\n' "$n" $((4 * n)) "$tok" "$(efficiency "$tok" "$one")"
  done
  ;;
bubble)
  echo "== pipeline bubble, 24 layers of the 1.1B shape, 16 micro-batches of 4, $iters iterations"
  one=$(bench one24 1 64 --num-layers 24)
  printf '| run | micro-batches m | virtual stages v | tokens/s/GPU | measured bubble | theory (p-1)/(v m+p-1) |\n|---|---|---|---|---|---|\n'
  printf '| 1 GPU | 16 | - | %s | - | - |\n' "$one"
  for layout in "4:1" "4:2" "8:1" "8:3"; do
    p=${layout%%:*}; v=${layout#*:}
    [ "$p" -le "$gpus" ] || continue
    flags=(--num-layers 24 --pipeline-model-parallel-size "$p")
    [ "$v" = 1 ] || flags+=(--num-virtual-stages-per-pipeline-rank "$v")
    tok=$(bench "pp${p}_v$v" "$p" 64 "${flags[@]}")
    awk -v p="$p" -v v="$v" -v t="$tok" -v b="$one" 'BEGIN { m = 16; theory = (p - 1) / (v * m + p - 1);
      if (t > 0 && b > 0) printf "| PP=%d | %d | %d | %.0f | %.1f%% | %.1f%% |\n", p, m, v, t, 100 * (1 - t / b), 100 * theory;
      else printf "| PP=%d | %d | %d | n/a | n/a | %.1f%% |\n", p, m, v, 100 * theory }'
  done
  ;;
8b)
  echo "== Llama-3-8B shape, seq 8192, micro-batch 1, bf16, distributed optimizer, ${BENCH_8B_ITERS:-10} iterations, $gpus GPUs"
  printf '| layout (TP x PP x DP) | global batch | tokens/s/GPU | TFLOP/s/GPU | MFU | max allocated (MB) |\n|---|---|---|---|---|---|\n'
  echo "extra flags: ${BENCH_8B_FLAGS:-none}"
  for layout in ${BENCH_8B_LAYOUTS:-1:1 2:1 4:1 8:1 2:2 4:2 1:2}; do
    tp=${layout%%:*}; pp=${layout#*:}
    [ $((tp * pp)) -le "$gpus" ] || continue
    dp=$((gpus / (tp * pp))); gbs=$((dp * 8))  # 8 micro-batches per data-parallel replica
    name="tp${tp}_pp${pp}_dp$dp"
    "$bin" launch --nproc-per-node "$gpus" --master-port 0 train --config examples/llama3-8b.yaml --mock-data \
      --tokenizer-type NullTokenizer --vocab-size 128255 --train-iters "${BENCH_8B_ITERS:-10}" --log-interval $(( ${BENCH_8B_ITERS:-10} / 2 )) \
      --eval-interval 0 --save-interval 0 --lr-warmup-iters 1 --log-throughput --global-batch-size "$gbs" --tensor-model-parallel-size "$tp" \
      --pipeline-model-parallel-size "$pp" --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
      $([ "$tp" -gt 1 ] && echo --sequence-parallel) ${BENCH_8B_FLAGS:-} > "$work/$name.log" 2>&1 || { echo "FAILED: $name"; tail -5 "$work/$name.log"; }
    line=$(grep " iteration" "$work/$name.log" | tail -1)
    printf '| %s x %s x %s | %s | %s | %s | %s%% | %s |\n' "$tp" "$pp" "$dp" "$gbs" \
      "$(sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$line")" \
      "$(sed -n 's/.*TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$line")" \
      "$(sed -n 's/.*MFU: \([0-9.]*\)%.*/\1/p' <<< "$line")" \
      "$(sed -n 's/.*max allocated: \([0-9.]*\).*/\1/p' "$work/$name.log" | head -1)"
  done
  ;;
*) echo "usage: bash bench/gpu_scaling.sh MEGATRON_BINARY equivalence|dp|bubble|8b"; exit 2 ;;
esac
show_logs
rm -rf "$work"
exit $status
