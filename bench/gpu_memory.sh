#!/usr/bin/env bash
# Issue #24's memory comparison: a 2B Qwen3-sized Llama shape (hidden 2048, 28 layers, 16 heads /
# 8 query groups, head dim 128, ffn 6144, vocab 151936 untied, seq 4096, micro-batch 1, bf16) where
# HF transformers needs far less memory than fp32 masters, moments and gradients (16 bytes a
# parameter against its 8). megatron.cpp as it trains by default, then with the precision-aware
# optimizer's bf16 moments and bf16 gradients, next to HF eager and torch.compile (fused AdamW,
# bf16 parameters and state) in the same call: tokens/s and peak allocated memory.
#   bash bench/gpu_memory.sh MEGATRON_BINARY PYTHON HF_BASELINE_SCRIPT
set -uo pipefail
bin=$1; py=$2; baseline=$3
iters=${BENCH_ITERS:-20}
source "$(dirname "$0")/lib.sh"
shape=("${qwen3_2b[@]}")
ours() {  # name flags... -> "tokens/s peak-GiB"
  local name=$1; shift
  "$bin" train "${shape[@]}" --train-iters "$iters" --log-interval 10 "$@" > "/tmp/$name.log" 2>&1 \
    || { echo "FAILED: $name" >&2; tail -20 "/tmp/$name.log" >&2; echo "0 0"; return; }
  local tok mem
  tok=$(grep " iteration" "/tmp/$name.log" | tail -1 | sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p')
  mem=$(grep -o 'max allocated: [0-9.]*' "/tmp/$name.log" | head -1 | awk '{printf "%.1f", $3 / 1024}')
  grep -m1 "number of parameters" "/tmp/$name.log" >&2
  echo "$tok $mem"
}
hf() {  # flags... -> the baseline's line
  "$py" "$baseline" --layers 28 --hidden 2048 --ffn 6144 --heads 16 --kv-heads 8 --vocab 151936 --seq 4096 --mb 1 --iters 10 "$@" 2>&1 | tail -1
}
default=$(ours default)
state=(--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --main-grads-dtype bf16)
low=$(ours bf16_state "${state[@]}")
# The same with activations traded for time: the dense MLPs recomputed in the backward (and the
# norms too). Sending activations to host memory instead: bench/gpu_activation_offload.sh.
mlp=$(ours bf16_state_mlp "${state[@]}" --recompute-granularity selective --recompute-modules mlp)
mlp_norm=$(ours bf16_state_mlp_norm "${state[@]}" --recompute-granularity selective --recompute-modules mlp layernorm)
eager=$(hf); compiled=$(hf --compile)
echo "$eager"; echo "$compiled"
hf_tok() { sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p' <<< "$1"; }
hf_mem() { sed -n 's/.*peak mem \([0-9.]*\) GiB.*/\1/p' <<< "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
ctok=$(hf_tok "$compiled"); cmem=$(hf_mem "$compiled")
printf '\n| system | tokens/s | peak allocated (GiB) | tokens/s vs compile | memory vs compile |\n|---|---|---|---|---|\n'
row() { printf '| %s | %s | %s | %s | %s |\n' "$1" "$2" "$3" "$(ratio "$2" "$ctok")" "$(ratio "$3" "$cmem")"; }
row "megatron.cpp (fp32 masters, moments, gradients)" $default
row "megatron.cpp, bf16 moments and gradients (precision-aware)" $low
row "the same, --recompute-modules mlp" $mlp
row "the same, --recompute-modules mlp layernorm" $mlp_norm
row "HF eager" "$(hf_tok "$eager")" "$(hf_mem "$eager")"
row "HF torch.compile" "$ctok" "$cmem"
