#!/usr/bin/env bash
# bench/gpu_deepseek.sh's comparison cut to what ~3 minutes of device time after the build holds,
# the most telling runs first (each line is printed as it finishes, so a call cut short still
# reports them): megatron.cpp at global batch 8, HF eager at 8, megatron.cpp at 1, HF + torch.compile
# at 8 and 1. Fewer steps than the full script (12 of ours at global batch 1, 6 at 8; 4 of HF's
# after 3 warm-up steps), so the figures are a first look, not the record.
#   bash bench/gpu_deepseek_short.sh MEGATRON_BINARY PYTHON [OUT_DIR]
set -uo pipefail
bin=$1 py=$2 out=${3:-/tmp/deepseek}
mkdir -p "$out"
iters=12 start=$(date +%s)
eval "$(sed -n '/^shape=(/,/--device cuda)$/p' bench/gpu_deepseek.sh)"  # the one shape both scripts time
source bench/lib.sh
hf() { "$py" bench/hf_deepseek_baseline.py --iters 4 "$@" 2>&1 | grep -E "baseline|Error" | tail -3; }
elapsed() { echo "($(( $(date +%s) - start )) s)"; }
ours8=$(run_shape real_gbs8 8); echo "megatron.cpp, global batch 8: tokens/s, TFLOP/s, max allocated MB = $ours8 $(elapsed)"
eager=$(hf --grad-accum 8); echo "$eager $(elapsed)"
echo "ratio to HF eager, global batch 8: $(ratio "$ours8" "$(hf_tokens "$eager" 8)")"
ours1=$(run_shape real_gbs1 1); echo "megatron.cpp, global batch 1: tokens/s, TFLOP/s, max allocated MB = $ours1 $(elapsed)"
compiled=$(hf --compile --grad-accum 8 1); echo "$compiled $(elapsed)"
echo "ratio to HF + torch.compile: global batch 8 $(ratio "$ours8" "$(hf_tokens "$compiled" 8)"), 1 $(ratio "$ours1" "$(hf_tokens "$compiled" 1)")"
