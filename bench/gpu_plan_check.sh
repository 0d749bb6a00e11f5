#!/usr/bin/env bash
# `megatron plan`'s memory estimate against the peak a short run measures, on shapes the planner
# was not calibrated on (tests/plan/test_plan.cpp holds those): each shape trains 3 steps on this
# GPU (mock data) and its memory report's max allocated is set beside the plan's estimate of what
# the allocator holds at its peak (weights + gradients + optimizer + activations + logits).
#   bash bench/gpu_plan_check.sh BUILD/megatron      (PLAN_CHECK_SET=more: a second set of shapes)
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
bf16_state=(--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --main-grads-dtype bf16)
if [ "${PLAN_CHECK_SET:-first}" = more ]; then
  # Recomputation of MLA's and the experts' parts, shared experts behind a gate, dropout masks.
  deepseek_lite=(--model-family deepseek_v2 --num-layers 6 --hidden-size 2048 --num-attention-heads 16 --kv-lora-rank 512
                 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 --ffn-hidden-size 10944 --num-experts 64
                 --moe-router-topk 6 --moe-ffn-hidden-size 1408 --moe-shared-expert-intermediate-size 2816
                 --moe-layer-freq "([0]*1+[1]*5)" --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1
                 --tokenizer-type NullTokenizer --vocab-size 102399 --bf16 --global-batch-size 1 --lr 1e-4)
  qwen_moe=(--model-family qwen3_moe --num-layers 6 --hidden-size 2048 --num-attention-heads 32 --num-query-groups 4
            --kv-channels 128 --ffn-hidden-size 6144 --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768
            --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --tokenizer-type NullTokenizer
            --vocab-size 151935 --bf16 --global-batch-size 1 --lr 1e-4)
  check "DeepSeek-V2-Lite shape, 6 layers, bf16 state, recompute mla_up_proj moe_act layernorm" "${deepseek_lite[@]}" "${bf16_state[@]}" \
    --recompute-granularity selective --recompute-modules mla_up_proj moe_act layernorm
  check "Qwen3-30B-A3B shape, 6 layers, bf16 state, recompute moe" "${qwen_moe[@]}" "${bf16_state[@]}" \
    --recompute-granularity selective --recompute-modules moe
  check "Qwen2-57B-A14B shape, 2 layers, bf16 state" --config examples/qwen2-57b-a14b.yaml --tokenizer-type NullTokenizer \
    --vocab-size 151935 --num-layers 2 --global-batch-size 1 --micro-batch-size 1 --seq-length 4096 "${bf16_state[@]}"
  check "Llama 1.1B shape, hidden dropout 0.1, micro-batch 2" --config examples/llama-1.1b-bench.yaml --hidden-dropout 0.1 \
    --micro-batch-size 2 --global-batch-size 2
  exit 0
fi
check "Qwen3-8B shape, 6 layers, seq 4096, micro-batch 2" "${qwen8b[@]}"
check "DeepSeek-V3-like, 4 layers of hidden 2048, 32 experts, MTP 1, seq 4096" "${deepseek[@]}"
check "Llama-3-8B shape, 6 layers, seq 8192, block recompute of 3" "${llama8b[@]}"
check "Llama 1.1B shape in fp32, micro-batch 2" "${tiny_fp32[@]}"
