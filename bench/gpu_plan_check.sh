#!/usr/bin/env bash
# `megatron plan`'s memory estimate against the peak a short run measures, on shapes the planner
# was not calibrated on (tests/plan/test_plan.cpp holds those): each shape trains 3 steps on this
# GPU (mock data) and its memory report's max allocated is set beside the plan's estimate of what
# the allocator holds at its peak (weights + gradients + optimizer + activations + logits).
#   bash bench/gpu_plan_check.sh BUILD/megatron
set -uo pipefail
bin=${1:?usage: gpu_plan_check.sh MEGATRON_BINARY}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 || echo h100)
qwen8b=(--config examples/qwen3-8b.yaml --tokenizer-type NullTokenizer --vocab-size 151935 --num-layers 6 --micro-batch-size 2 --global-batch-size 2)
deepseek=(--config examples/deepseek-v3.yaml --tokenizer-type NullTokenizer --vocab-size 129279 --num-layers 4 --hidden-size 2048 --num-attention-heads 16
          --q-lora-rank 768 --num-experts 32 --moe-router-num-groups 4 --moe-router-group-topk 2 --moe-ffn-hidden-size 1024
          --moe-shared-expert-intermediate-size 1024 --moe-layer-freq "([0]*1+[1]*3)" --ffn-hidden-size 8192
          --global-batch-size 1 --micro-batch-size 1)
llama8b=(--config examples/llama3-8b.yaml --tokenizer-type NullTokenizer --vocab-size 128255 --num-layers 6 --global-batch-size 1
         --recompute-granularity full --recompute-method block --recompute-num-layers 3)
tiny_fp32=(--config examples/llama-1.1b-bench.yaml --bf16 false --micro-batch-size 2 --global-batch-size 2)
echo "| shape | measured max allocated (GiB) | plan's estimate (GiB) | estimate / measured |"
echo "|---|---|---|---|"
check() {
  local name=$1; shift
  local log; log=$(mktemp)
  "$bin" train "$@" --mock-data --train-iters 3 --lr-warmup-iters 0 --log-interval 1 --eval-interval 0 --device cuda > "$log" 2>&1 \
    || { echo "| $name | FAILED: $(grep -m1 -i error "$log") | | |"; return; }
  local measured; measured=$(grep -m1 -o "max allocated: [0-9.]*" "$log" | awk '{ print $3 / 1024 }')
  grep -m1 "memory (MB)" "$log" >&2
  # The plan's row: "weights+grads / optimizer / activations+logits / other = total".
  local estimate; estimate=$("$bin" plan "$@" --num-gpus 1 --gpu "$gpu" --top 1 | awk -F'|' '/^\| 1 \|/ { split($11, t, " "); print t[1] + t[3] + t[5] }')
  awk -v n="$name" -v m="$measured" -v e="$estimate" 'BEGIN { printf "| %s | %.1f | %.1f | %.3f |\n", n, m, e, (m > 0 ? e / m : 0) }'
}
check "Qwen3-8B shape, 6 layers, seq 4096, micro-batch 2" "${qwen8b[@]}"
check "DeepSeek-V3-like, 4 layers of hidden 2048, 32 experts, MTP 1, seq 4096" "${deepseek[@]}"
check "Llama-3-8B shape, 6 layers, seq 8192, block recompute of 3" "${llama8b[@]}"
check "Llama 1.1B shape in fp32, micro-batch 2" "${tiny_fp32[@]}"
