#!/usr/bin/env bash
# Issue #22's one-GPU figures. (1) The ring's attention work against one fused attention over the
# same tokens, seq 32k-128k, CP 2/4/8 (bench/context_attention_bench.cpp). (2) The 1.1B reference
# shape training at seq 32k and 64k (micro-batch 1), without recomputation where it fits and with
# full recomputation of every layer where it does not: tokens/s, MFU and peak memory, next to HF +
# torch.compile at the same length in the same call (the HF baseline at micro-batch 1; an HF run
# that runs out of memory is reported as such).
#   bash bench/gpu_context_parallel.sh BUILD_DIR PYTHON HF_BASELINE_SCRIPT
set -uo pipefail
build=$1; py=$2; baseline=$3
bin=$build/megatron
# BENCH_ATTENTION_ARGS: more flags for it (e.g. --causal 0: the packed documents' table alone).
"$build/megatron_bench_context_attention" --iters "${BENCH_ATTENTION_ITERS:-5}" ${BENCH_ATTENTION_ARGS:-} || echo "FAILED: attention bench"
[ "${CP_ATTENTION_ONLY:-0}" = 1 ] && exit 0  # the attention figure alone
iters=${BENCH_ITERS:-8}  # even: the log interval is half of it, so the last iteration is logged
ours() {  # seq extra-flags... -> the last log interval's line and the memory report
  local seq=$1; shift
  "$bin" train --config examples/llama-1.1b-bench.yaml --mock-data --train-iters "$iters" --log-interval $(( iters / 2 )) \
    --micro-batch-size 1 --global-batch-size 1 --seq-length "$seq" --max-position-embeddings "$seq" "$@" 2>&1
}
for seq in 32768 65536; do
  echo "== seq $seq"
  log=$(ours "$seq")
  how="no recomputation"
  if ! grep -q " iteration *$iters/" <<< "$log"; then
    grep -E "error|out of memory" <<< "$log" | head -2
    how="full recomputation, 1 layer per group"
    log=$(ours "$seq" --recompute-granularity full --recompute-method uniform --recompute-num-layers 1)
  fi
  last=$(grep " iteration" <<< "$log" | tail -1)
  mem=$(sed -n 's/.*max allocated: \([0-9.]*\).*/\1/p' <<< "$log" | head -1)
  echo "megatron.cpp ($how): tokens/s/GPU $(sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$last")," \
       "MFU $(sed -n 's/.*MFU: \([0-9.]*\)%.*/\1/p' <<< "$last")%, peak $(awk -v m="$mem" 'BEGIN { printf "%.1f", m / 1024 }') GiB"
  "$py" "$baseline" --mb 1 --seq "$seq" --compile --iters 5 2>&1 | grep -E "tok/s|OutOfMemory|out of memory" | tail -1
done
