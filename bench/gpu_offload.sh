#!/usr/bin/env bash
# Issue #24's optimizer CPU offload on one GPU: the Llama-3-8B shape (hidden 4096, ffn 14336, 32
# heads / 8 query groups, vocab 128256, seq 8192, micro-batch 1, global batch OFFLOAD_GBS, default
# 16) cut down to OFFLOAD_SMALL_LAYERS layers (default 8) with the default optimizer on the
# device, against all 32 layers with --optimizer-cpu-offload (precision-aware, bf16 moments, the
# copies overlapped). Tokens/s x layers compares the two per layer. OFFLOAD_TRY_FULL=1 also tries
# the 32 layers without offloading (expected not to fit).
#   bash bench/gpu_offload.sh MEGATRON_BINARY OUT_DIR
set -uo pipefail
bin=$1; out=$2
mkdir -p "$out"
gbs=${OFFLOAD_GBS:-16}
small=${OFFLOAD_SMALL_LAYERS:-8}
iters=${OFFLOAD_ITERS:-5}
shape=(--config examples/llama3-8b.yaml --micro-batch-size 1 --global-batch-size "$gbs" --device cuda --eval-interval 0
       --log-throughput --cross-entropy-loss-fusion --hidden-dropout 0 --attention-dropout 0 --tokenizer-type NullTokenizer
       --vocab-size 128255 --mock-data --lr 3e-4 --lr-warmup-iters 1 --log-interval 1 --train-iters "$iters")
offload=(--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 --optimizer-cpu-offload
         --overlap-cpu-optimizer-d2h-h2d)
nproc >/dev/null && echo "host: $(nproc) CPUs, $(awk '/MemTotal|MemAvailable/ {printf "%s %.1f GiB  ", $1, $2 / 1048576}' /proc/meminfo)"

# name layers flags...: tokens/s over the iterations after the first, peak allocated, host peak RSS.
run() {
  local name=$1 layers=$2; shift 2
  local timer=()
  [ -x /usr/bin/time ] && timer=(/usr/bin/time -v)
  "${timer[@]}" "$bin" train "${shape[@]}" --num-layers "$layers" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "| $name | $layers | failed (exit $rc): $(grep -m1 -o 'out of memory\|error:.*' "$out/$name.log" | head -c 120) | | | | |"
    return
  fi
  local tok mem rss per_layer
  tok=$(grep " iteration" "$out/$name.log" | tail -n +2 | sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p' |
        awk '{ s += $1; n++ } END { if (n) printf "%.0f", s / n }')
  mem=$(grep -o 'max allocated: [0-9.]*' "$out/$name.log" | head -1 | awk '{printf "%.1f", $3 / 1024}')
  rss=$(grep -o 'Maximum resident set size (kbytes): [0-9]*' "$out/$name.log" | awk '{printf "%.1f", $6 / 1048576}')
  per_layer=$(awk -v t="$tok" -v l="$layers" 'BEGIN { printf "%.0f", t * l }')
  echo "| $name | $layers | $tok | $per_layer | $mem | ${rss:-?} |"
  eval "per_layer_$name=$per_layer"
}

printf '| run | layers | tokens/s | tokens/s x layers | peak allocated (GiB) | host peak RSS (GiB) |\n|---|---|---|---|---|---|\n'
run device "$small"
run offload 32 "${offload[@]}"
[ "${OFFLOAD_TRY_FULL:-0}" = 1 ] && run full32 32
awk -v a="${per_layer_offload:-0}" -v b="${per_layer_device:-0}" \
  'BEGIN { if (b > 0) printf "offloaded 32 layers per layer: %.3fx the cut-down model on the device\n", a / b }'
grep -h "optimizer\|offload" "$out/offload.log" | grep -v " iteration" | head -5
