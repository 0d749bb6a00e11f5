#!/usr/bin/env bash
# One H200: the issue's Qwen3-30B-A3B layer shape cut to 6 layers (hidden 2048, 128 experts, top-8,
# expert ffn 768, 32 heads / 4 kv groups, head dim 128, vocab 151936), seq 4096, micro-batch 1,
# bf16, against HF transformers' Qwen3-MoE in the same call (bench/hf_moe_baseline.py: experts
# through grouped_mm, SDPA, fused AdamW; eager and torch.compile; the eager experts loop too).
#   bash bench/gpu_moe.sh MEGATRON_BINARY PYTHON [OUT_DIR]
# megatron.cpp runs with Megatron's speed flags (grouped GEMM, fused permutation, fused cross entropy) at a global
# batch of 1 micro-batch (an optimizer step per 4096 tokens, where the fp32 optimizer weighs most)
# and of 8 (gradient accumulation, as MoE training runs; HF accumulates the same way), with real
# routing (balancing loss on), and at 8 also force-balanced (--moe-router-force-load-balancing) and
# with bf16 gradients, at 1 also with the optimizer step overlapped; then profiled at both.
# Prints tokens/s, TFLOP/s (both counts) and peak memory, and the ratios.
set -uo pipefail
bin=$1 py=$2 out=${3:-/tmp/moe}
mkdir -p "$out"
iters=${BENCH_ITERS:-30}
shape=(--model-family qwen3_moe --num-layers 6 --hidden-size 2048 --num-attention-heads 32 --num-query-groups 4
       --kv-channels 128 --ffn-hidden-size 6144 --num-experts 128 --moe-router-topk 8 --moe-ffn-hidden-size 768
       --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1
       --tokenizer-type NullTokenizer --vocab-size 151935 --mock-data --bf16 --lr 1e-4 --lr-warmup-iters 2
       --moe-grouped-gemm --moe-permute-fusion --cross-entropy-loss-fusion --moe-aux-loss-coeff 1e-3 --moe-router-dtype fp32
       --eval-interval 0 --device cuda)
source bench/lib.sh
hf() { "$py" bench/hf_moe_baseline.py "$@" 2>&1 | grep baseline; }
# Megatron's num_floating_point_operations per token for this shape (bench/hf_moe_baseline.py's formula).
megatron_tflops() { awk -v r="${1%% *}" 'BEGIN {
  h = 2048; f = 768; k = 8; L = 6; s = 4096; q = 32 * 128; kv = 4 * 128; V = 151936
  per_token = L * (6 * (h * (q + 2 * kv) + q * h) + 6 * q * s + 18 * h * f * k) + 6 * h * V
  printf "%.0f", per_token * r / 1e12 }'; }

# PRECISION_ONLY=1: global batch 8 only, the default optimizer state against bf16 gradients and
# moments, and HF compiled (bench/lib.sh's precision_only).
if [ "${PRECISION_ONLY:-0}" = 1 ]; then precision_only; exit 0; fi
# GRAPH_ONLY=1: global batch 8, bf16 gradients and moments, eager against one CUDA graph a step (graph_only).
if [ "${GRAPH_ONLY:-0}" = 1 ]; then GRAPH_BALANCED=${GRAPH_BALANCED:-1} graph_only; exit 0; fi
# FP8_ONLY=1: global batch 8, bf16 against FP8 (the experts' grouped FP8 GEMMs), bench/lib.sh's fp8_only.
if [ "${FP8_ONLY:-0}" = 1 ]; then fp8_only; exit 0; fi
# FP8_PROFILE=1: where an FP8 step's time goes (global batch 1, iterations 10-11, the kernel table).
if [ "${FP8_PROFILE:-0}" = 1 ]; then
  "$bin" train "${shape[@]}" --fp8-format hybrid --fp8-recipe tensorwise --global-batch-size 1 --train-iters 12 --log-interval 6 \
    --profile --profile-step-start 10 --profile-step-end 12 --tensorboard-dir "$out/profile-fp8" > "$out/profile-fp8.log" 2>&1 \
    || echo "FAILED: FP8 profile"
  grep -v "^ iteration" "$out/profile-fp8.log" | grep "^>" | tail -45
  exit 0
fi
declare -A real
for gbs in 1 8; do
  real[$gbs]=$(run_shape "real_gbs$gbs" $gbs)
  echo "megatron.cpp, global batch $gbs, real routing: tokens/s, TFLOP/s, max allocated MB = ${real[$gbs]} (Megatron's count $(megatron_tflops "${real[$gbs]}") TFLOP/s)"
done
balanced=$(run_shape balanced_gbs8 8 --moe-router-force-load-balancing)
echo "megatron.cpp, global batch 8, force-balanced: tokens/s, TFLOP/s, max allocated MB = $balanced"
bf16_grads=$(run_shape bf16_grads_gbs8 8 --grad-reduce-in-bf16)
echo "megatron.cpp, global batch 8, real routing, --grad-reduce-in-bf16: tokens/s, TFLOP/s, max allocated MB = $bf16_grads"
overlap=$(run_shape overlap_gbs1 1 --overlap-optimizer-step)
echo "megatron.cpp, global batch 1, real routing, --overlap-optimizer-step: tokens/s, TFLOP/s, max allocated MB = $overlap"
# HF: one process per mode times both global batches on the same (compiled) model.
hf_eager=$(hf --iters 10 --grad-accum 1 8); echo "$hf_eager"
hf_compiled=$(hf --compile --iters 10 --grad-accum 1 8); echo "$hf_compiled"
for gbs in 1 8; do
  best=$(printf '%s\n%s\n' "$(hf_tokens "$hf_eager" $gbs)" "$(hf_tokens "$hf_compiled" $gbs)" | sort -n | tail -1)
  line="RATIO global batch $gbs, to the faster HF run ($best tok/s): real routing $(ratio "${real[$gbs]}" "$best")"
  if [ $gbs = 1 ]; then
    line+=", overlapped optimizer step $(ratio "$overlap" "$best")"
  else
    line+=", force-balanced $(ratio "$balanced" "$best"), bf16 gradients $(ratio "$bf16_grads" "$best")"
  fi
  echo "$line"
done
if [ "${MOE_HF_LOOP:-0}" = 1 ]; then hf --experts eager --iters 3; fi
[ "${MOE_PROFILE:-1}" = 1 ] || exit 0
# Where the time goes: one step at global batch 1 (the optimizer's share) and one at 8 (eight
# micro-batches' forward and backward, the gradients accumulated).
"$bin" train "${shape[@]}" --global-batch-size 1 --train-iters 12 --log-interval 6 --profile --profile-step-start 10 \
  --profile-step-end 12 --tensorboard-dir "$out/profile" > "$out/profile.log" 2>&1 || echo "FAILED: profile"
grep -v "^ iteration" "$out/profile.log" | grep "^>" | tail -32
"$bin" train "${shape[@]}" --global-batch-size 8 --train-iters 4 --log-interval 2 --profile --profile-step-start 3 \
  --profile-step-end 4 --tensorboard-dir "$out/profile8" > "$out/profile8.log" 2>&1 || echo "FAILED: profile at global batch 8"
grep -v "^ iteration" "$out/profile8.log" | grep "^>" | tail -32
