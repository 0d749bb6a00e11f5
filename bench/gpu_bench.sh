#!/usr/bin/env bash
# The single-GPU benchmark: megatron.cpp on the reference shape (Llama 1.1B: hidden 2048,
# 22 layers, 32 heads, 4 query groups, ffn 5632, vocab 32000, seq 2048, micro-batch 4, bf16)
# next to the HF transformers baseline (eager and torch.compile), same machine, same call.
# megatron.cpp runs three times: the eager step, the step replayed as a CUDA graph
# (--cuda-graph-impl local), and the eager step with the opt-in speed flags that change the
# schedule or the gradients' precision (--overlap-optimizer-step --grad-reduce-in-bf16).
# Each run's GPU power draw and SM clock are sampled (nvidia-smi, every 100 ms) and averaged over
# the samples above 60% of the run's highest power, i.e. the training steps, not start-up.
#   bash bench/gpu_bench.sh MEGATRON_BINARY PYTHON HF_BASELINE_SCRIPT [extra train flags]
# BENCH_SEQ=8192 runs both at another sequence length (same micro-batch).
set -uo pipefail
bin=$1; py=$2; baseline=$3
source "$(dirname "$0")/lib.sh"  # power_summary
iters=${BENCH_ITERS:-30}
seq=${BENCH_SEQ:-2048}
ours() {  # train flags -> megatron.cpp's log (also on stderr)
  "$bin" train --config examples/llama-1.1b-bench.yaml --mock-data --train-iters "$iters" --log-interval 10 \
    --seq-length "$seq" --max-position-embeddings "$seq" "$@" 2>&1 | tee /dev/stderr
}
samples=$(mktemp)
sampled() {  # command... -> its output; the power / clock summary into $power_of_last
  nvidia-smi --query-gpu=power.draw,clocks.sm --format=csv,noheader,nounits -lms 100 > "$samples" 2>/dev/null &
  local sampler=$!
  "$@"
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  power_of_last=$(power_summary "$samples")
}
sampled ours "${@:4}" > "$samples.out"; eager_log=$(cat "$samples.out"); eager_power=$power_of_last
sampled ours "${@:4}" --cuda-graph-impl local > "$samples.out"; graph_log=$(cat "$samples.out"); graph_power=$power_of_last
sampled ours "${@:4}" --overlap-optimizer-step --grad-reduce-in-bf16 > "$samples.out"; fast_log=$(cat "$samples.out"); fast_power=$power_of_last
sampled "$py" "$baseline" --seq "$seq" --iters 10 > "$samples.out" 2>&1; eager=$(tail -1 "$samples.out"); hf_eager_power=$power_of_last
sampled "$py" "$baseline" --seq "$seq" --compile --iters 10 > "$samples.out" 2>&1; compiled=$(tail -1 "$samples.out"); hf_compiled_power=$power_of_last
echo "GPU power limit: $(nvidia-smi --query-gpu=power.limit,clocks.max.sm --format=csv,noheader)"
echo "$eager"; echo "$compiled"; rm -f "$samples" "$samples.out"
eager_tok=$(sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p' <<< "$eager")
compiled_tok=$(sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p' <<< "$compiled")
eager_mem=$(sed -n 's/.*peak mem \([0-9.]*\) GiB.*/\1/p' <<< "$eager")
compiled_mem=$(sed -n 's/.*peak mem \([0-9.]*\) GiB.*/\1/p' <<< "$compiled")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
row() {  # name log power -> a table row from the last log interval
  local last tok mfu tflops mem
  last=$(grep " iteration" <<< "$2" | tail -1)
  tok=$(sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$last")
  mfu=$(sed -n 's/.*MFU: \([0-9.]*\)%.*/\1/p' <<< "$last")
  tflops=$(sed -n 's/.*TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$last")
  mem=$(sed -n 's/.*max allocated: \([0-9.]*\).*/\1/p' <<< "$2" | head -1)
  mem=$(awk -v m="$mem" 'BEGIN { if (m != "") printf "%.1f", m / 1024; else print "n/a" }')
  printf '| %s | %s | %s | %s%% | %s | %s | %s | %s |\n' "$1" "$tok" "$tflops" "$mfu" "$mem" \
    "$(ratio "$tok" "$eager_tok")" "$(ratio "$tok" "$compiled_tok")" "$3"
}
printf '\n| system | tokens/s/GPU | TFLOP/s/GPU | MFU | peak memory (GiB) | ratio vs eager | ratio vs compile | power / SM clock |\n|---|---|---|---|---|---|---|---|\n'
row "megatron.cpp" "$eager_log" "$eager_power"
row "megatron.cpp, CUDA graph step" "$graph_log" "$graph_power"
row "megatron.cpp --overlap-optimizer-step --grad-reduce-in-bf16" "$fast_log" "$fast_power"
printf '| HF eager | %s | | (see line above) | %s | 1.00 | | %s |\n| HF torch.compile | %s | | (see line above) | %s | | 1.00 | %s |\n' \
  "$eager_tok" "$eager_mem" "$hf_eager_power" "$compiled_tok" "$compiled_mem" "$hf_compiled_power"
