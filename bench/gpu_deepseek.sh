#!/usr/bin/env bash
# One H200: issue #21's DeepSeek-V2-Lite layer shape cut to 6 layers (hidden 2048, 16 heads, kv
# latent 512, 128 + 64 rotary query/key channels, values 128, 64 experts top-6 with 2 shared,
# expert ffn 1408, the first layer dense with ffn 10944, vocab 102400), seq 4096, micro-batch 1,
# bf16, against HF transformers' DeepseekV2 in the same call (bench/hf_deepseek_baseline.py:
# experts through grouped_mm, SDPA, fused AdamW; eager and torch.compile), at global batches 8 and
# 1 (most telling first); then megatron.cpp with one multi-token prediction depth (HF has none), and a profile.
#   bash bench/gpu_deepseek.sh MEGATRON_BINARY PYTHON [OUT_DIR]
set -uo pipefail
bin=$1 py=$2 out=${3:-/tmp/deepseek}
mkdir -p "$out"
iters=${BENCH_ITERS:-30}
shape=(--model-family deepseek_v2 --num-layers 6 --hidden-size 2048 --num-attention-heads 16 --kv-lora-rank 512
       --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 --rotary-scaling-factor 40 --mscale 0.707
       --mscale-all-dim 0.707 --ffn-hidden-size 10944 --num-experts 64 --moe-router-topk 6 --moe-ffn-hidden-size 1408
       --moe-shared-expert-intermediate-size 2816 --moe-layer-freq "([0]*1+[1]*5)" --seq-length 4096
       --max-position-embeddings 4096 --micro-batch-size 1 --tokenizer-type NullTokenizer --vocab-size 102399 --mock-data
       --bf16 --lr 1e-4 --lr-warmup-iters 2 --moe-grouped-gemm --moe-permute-fusion --cross-entropy-loss-fusion
       --moe-aux-loss-coeff 1e-3 --moe-router-dtype fp32 --eval-interval 0 --device cuda)
source bench/lib.sh
hf() { "$py" bench/hf_deepseek_baseline.py "$@" 2>&1 | grep -E "baseline|Error" | tail -3; }
began=$(date +%s); elapsed() { echo "($(( $(date +%s) - began )) s)"; }
# The most telling runs first, each line printed as it finishes, so a call cut short still reports them.
# PRECISION_ONLY=1: global batch 8 only, the default optimizer state against bf16 gradients and
# moments, and HF compiled (bench/lib.sh's precision_only).
if [ "${PRECISION_ONLY:-0}" = 1 ]; then precision_only; exit 0; fi
# GRAPH_ONLY=1: global batch 8, bf16 gradients and moments, eager against one CUDA graph a step (graph_only).
if [ "${GRAPH_ONLY:-0}" = 1 ]; then graph_only; exit 0; fi
# FP8_ONLY=1: global batch 8, bf16 against FP8 (the experts' grouped FP8 GEMMs), bench/lib.sh's fp8_only.
if [ "${FP8_ONLY:-0}" = 1 ]; then fp8_only; exit 0; fi
declare -A real
real[8]=$(run_shape real_gbs8 8); echo "megatron.cpp, global batch 8: tokens/s, TFLOP/s, max allocated MB = ${real[8]} $(elapsed)"
hf_compiled=$(hf --compile --iters 10 --grad-accum 8 1); echo "$hf_compiled $(elapsed)"
real[1]=$(run_shape real_gbs1 1); echo "megatron.cpp, global batch 1: tokens/s, TFLOP/s, max allocated MB = ${real[1]} $(elapsed)"
hf_eager=$(hf --iters 10 --grad-accum 8 1); echo "$hf_eager $(elapsed)"
for gbs in 1 8; do
  best=$(printf '%s\n%s\n' "$(hf_tokens "$hf_eager" $gbs)" "$(hf_tokens "$hf_compiled" $gbs)" | sort -n | tail -1)
  echo "RATIO global batch $gbs, to the faster HF run ($best tok/s): $(ratio "${real[$gbs]}" "$best")"
done
mtp=$(run_shape mtp_gbs8 8 --mtp-num-layers 1)
echo "megatron.cpp, global batch 8, one MTP depth: tokens/s, TFLOP/s, max allocated MB = $mtp $(elapsed)"
"$bin" train "${shape[@]}" --global-batch-size 1 --train-iters 12 --log-interval 6 --profile --profile-step-start 10 \
  --profile-step-end 12 --tensorboard-dir "$out/profile" > "$out/profile.log" 2>&1 || echo "FAILED: profile"
grep -v "^ iteration" "$out/profile.log" | grep "^>" | tail -32
