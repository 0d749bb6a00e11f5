#!/usr/bin/env bash
# One H200: the issue's Qwen3-30B-A3B layer shape cut to 6 layers (hidden 2048, 128 experts, top-8,
# expert ffn 768, 32 heads / 4 kv groups, head dim 128, vocab 151936), seq 4096, micro-batch 1,
# bf16, against HF transformers' Qwen3-MoE in the same call (bench/hf_moe_baseline.py: experts
# through grouped_mm, SDPA, fused AdamW; eager and torch.compile; the eager experts loop too).
#   bash bench/gpu_moe.sh MEGATRON_BINARY PYTHON [OUT_DIR]
# megatron.cpp runs with real routing (balancing loss on) and force-balanced
# (--moe-router-force-load-balancing), then once more profiled (iterations 10-11) for where the
# time goes. Prints tokens/s, TFLOP/s (both counts) and peak memory, and the ratios.
set -uo pipefail
bin=$1 py=$2 out=${3:-/tmp/moe}
mkdir -p "$out"
iters=${BENCH_ITERS:-30}
shape=(--model-family qwen3_moe --num-layers 6 --hidden-size 2048 --num-attention-heads 32 --num-query-groups 4
       --kv-channels 128 --ffn-hidden-size 6144 --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768
       --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 1
       --tokenizer-type NullTokenizer --vocab-size 151935 --mock-data --bf16 --lr 1e-4 --lr-warmup-iters 2
       --moe-grouped-gemm --moe-aux-loss-coeff 1e-3 --moe-router-dtype fp32 --eval-interval 0 --device cuda)
ours() {  # name flags... -> "tokens/s TFLOP/s max-allocated-MB"
  local name=$1; shift
  "$bin" train "${shape[@]}" --train-iters "$iters" --log-interval 10 "$@" > "$out/$name.log" 2>&1 \
    || { echo "FAILED: $name" >&2; tail -20 "$out/$name.log" >&2; echo "0 0 0"; return; }
  local line; line=$(grep " iteration" "$out/$name.log" | tail -1)
  echo "$(sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$line")" \
       "$(sed -n 's/.*throughput per GPU (TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$line")" \
       "$(grep -o 'max allocated: [0-9.]*' "$out/$name.log" | head -1 | awk '{print $3}')"
}
hf() { "$py" bench/hf_moe_baseline.py "$@" 2>&1 | grep baseline | tail -1; }
hf_tokens() { sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p' <<< "$1"; }

real=$(ours real)
echo "megatron.cpp, real routing: tokens/s, TFLOP/s, max allocated MB = $real"
balanced=$(ours balanced --moe-router-force-load-balancing)
echo "megatron.cpp, force-balanced: tokens/s, TFLOP/s, max allocated MB = $balanced"
bf16_grads=$(ours bf16_grads --grad-reduce-in-bf16)
echo "megatron.cpp, real routing, --grad-reduce-in-bf16: tokens/s, TFLOP/s, max allocated MB = $bf16_grads"
hf_grouped=$(hf --iters 10); echo "$hf_grouped"
hf_compiled=$(hf --compile --iters 10); echo "$hf_compiled"
if [ "${MOE_HF_LOOP:-1}" = 1 ]; then hf --experts eager --iters 3; fi
best=$(printf '%s\n%s\n' "$(hf_tokens "$hf_grouped")" "$(hf_tokens "$hf_compiled")" | sort -n | tail -1)
awk -v r="${real%% *}" -v b="${balanced%% *}" -v g="${bf16_grads%% *}" -v h="$best" \
  'BEGIN { if (h > 0) printf "ratio to the faster HF run (%d tok/s): real routing %.3fx, force-balanced %.3fx, bf16 gradients %.3fx\n", h, r / h, b / h, g / h }'
# Megatron's num_floating_point_operations per token for this shape (bench/hf_moe_baseline.py's formula).
awk -v r="${real%% *}" -v b="${balanced%% *}" 'BEGIN {
  h = 2048; f = 768; k = 8; L = 6; s = 4096; q = 32 * 128; kv = 4 * 128; V = 151936
  per_token = L * (6 * (h * (q + 2 * kv) + q * h) + 6 * q * s + 18 * h * f * k) + 6 * h * V
  printf "megatron count: real routing %.0f TFLOP/s, force-balanced %.0f TFLOP/s\n", per_token * r / 1e12, per_token * b / 1e12 }'
"$bin" train "${shape[@]}" --train-iters 12 --log-interval 6 --profile --profile-step-start 10 --profile-step-end 12 \
  --tensorboard-dir "$out/profile" > "$out/profile.log" 2>&1 || echo "FAILED: profile"
grep -v "^ iteration" "$out/profile.log" | tail -45
