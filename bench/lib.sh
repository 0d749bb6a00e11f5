# Shared by the GPU benchmark scripts (sourced; the run helpers expect $bin, $work and $status set).
# Issue #24's 2B Qwen3-sized Llama shape (hidden 2048, 28 layers, 16 heads / 8 query groups, head
# dim 128, ffn 6144, vocab 151936 untied, seq 4096, micro-batch 1): bench/gpu_memory.sh and
# bench/gpu_activation_offload.sh.
qwen3_2b=(--config examples/llama-1.1b-bench.yaml --num-layers 28 --hidden-size 2048 --ffn-hidden-size 6144
          --num-attention-heads 16 --num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096
          --vocab-size 151935 --micro-batch-size 1 --global-batch-size 1 --mock-data --device cuda)
# The small Llama-shaped model of the NCCL equivalence checks.
small=(--num-layers 4 --hidden-size 512 --num-attention-heads 8 --group-query-attention --num-query-groups 4
       --ffn-hidden-size 1408 --swiglu --normalization RMSNorm --position-embedding-type rope --seq-length 512
       --micro-batch-size 2 --global-batch-size 8 --train-iters 20 --lr 3e-4 --lr-warmup-iters 2 --mock-data
       --tokenizer-type NullTokenizer --vocab-size 4095 --log-interval 5 --eval-interval 0 --bf16
       --hidden-dropout 0 --attention-dropout 0 --device cuda)
run_small() {  # name nproc flags...: trains the small model, losses into $work/name.jsonl
  local name=$1 nproc=$2; shift 2
  local cmd=("$bin")
  [ "$nproc" = 1 ] || cmd+=(launch --nproc-per-node "$nproc" --master-port 0)
  "${cmd[@]}" train "${small[@]}" "$@" --metrics-jsonl "$work/$name.jsonl" > "$work/$name.log" 2>&1 \
    || { echo "FAILED: $name"; tail -20 "$work/$name.log"; status=1; }
}
max_relative() {  # jsonl jsonl -> max over steps of |a - b| / |b|, and the number of steps
  paste <(grep -o '"lm_loss": [0-9.eE+-]*' "$1" | awk '{print $2}') <(grep -o '"lm_loss": [0-9.eE+-]*' "$2" | awk '{print $2}') |
    awk 'BEGIN { m = 0; n = 0 } { d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > m) m = d; n++ } END { printf "%.2e %d", m, n }'
}
bench() {  # name nproc global-batch flags... -> tokens/s/GPU of the last log interval on the 1.1B shape ($iters iterations)
  local name=$1 nproc=$2 gbs=$3; shift 3
  local cmd=("$bin")
  [ "$nproc" = 1 ] || cmd+=(launch --nproc-per-node "$nproc" --master-port 0)
  "${cmd[@]}" train --config examples/llama-1.1b-bench.yaml --mock-data --train-iters "$iters" --log-interval 10 \
    --global-batch-size "$gbs" "$@" > "$work/$name.log" 2>&1 || { echo "FAILED: $name"; tail -20 "$work/$name.log"; status=1; }
  grep " iteration" "$work/$name.log" | tail -1 | sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p'
}
power_summary() {  # nvidia-smi samples ("W, MHz" per line) -> "P W / C MHz", averaged over the
  # samples above 60% of the highest power: the training steps, not start-up or compilation
  awk -F', *' '{ p[NR] = $1; c[NR] = $2; if ($1 > max) max = $1 }
    END { for (i = 1; i <= NR; i++) if (p[i] >= 0.6 * max) { sp += p[i]; sc += c[i]; k++ }
          if (k) printf "%.0f W / %.0f MHz", sp / k, sc / k; else print "n/a" }' "$1"
}
# The MoE / DeepSeek comparisons (bench/gpu_moe.sh, gpu_deepseek.sh): megatron.cpp on the caller's
# `shape` array at a global batch, and what the HF baseline scripts print.
run_shape() {  # name global-batch flags... -> "tokens/s TFLOP/s max-allocated-MB" ($bin, $out, $iters; fewer steps at larger batches)
  local name=$1 gbs=$2; shift 2
  local n=$iters; [ "$gbs" -gt 1 ] && n=$(( iters / 2 ))
  "$bin" train "${shape[@]}" --global-batch-size "$gbs" --train-iters "$n" --log-interval $(( n / 3 )) --log-throughput "$@" > "$out/$name.log" 2>&1 \
    || { echo "FAILED: $name" >&2; tail -20 "$out/$name.log" >&2; echo "0 0 0"; return; }
  local line; line=$(grep " iteration" "$out/$name.log" | tail -1)
  echo "$(sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$line")" \
       "$(sed -n 's/.*throughput per GPU (TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$line")" \
       "$(grep -o 'max allocated: [0-9.]*' "$out/$name.log" | head -1 | awk '{print $3}')"
}
hf_tokens() { grep "grad_accum=$2 " <<< "$1" | sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p'; }  # baseline lines, global batch -> tok/s
ratio() { awk -v a="${1%% *}" -v b="$2" 'BEGIN { if (b > 0) printf "%.3fx", a / b; else printf "n/a" }'; }
# At global batch 8: the caller's shape with its default optimizer state, then with the baseline's
# precision of optimizer state or better (gradients and Adam moments in bf16 through the
# precision-aware optimizer, masters kept fp32; HF's AdamW updates bf16 weights directly), and the
# caller's `hf` baseline compiled; the ratios.
precision_only() {
  local default bf16_state hf_compiled best
  default=$(run_shape real_gbs8 8)
  echo "megatron.cpp, global batch 8, real routing: tokens/s, TFLOP/s, max allocated MB = $default"
  bf16_state=$(run_shape bf16_state_gbs8 8 --use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype bf16 \
               --exp-avg-sq-dtype bf16)
  echo "megatron.cpp, global batch 8, real routing, bf16 gradients and moments: tokens/s, TFLOP/s, max allocated MB = $bf16_state"
  hf_compiled=$(hf --compile --iters 10 --grad-accum 8); echo "$hf_compiled"
  best=$(hf_tokens "$hf_compiled" 8)
  echo "RATIO global batch 8, to HF compiled ($best tok/s): default $(ratio "$default" "$best"), bf16 gradients and moments $(ratio "$bf16_state" "$best")"
}
# At global batch 8: the caller's shape in bf16 and with FP8 GEMMs (--fp8-format hybrid, tensorwise
# recipe for attention and shared experts; the experts' grouped GEMMs row-wise, fp8/grouped.h),
# each with bf16 gradients and moments as well: the FP8 speed-up on our own bf16 in the same call.
fp8_only() {
  local bf16 fp8 bf16_state fp8_state
  local fp8_flags=(--fp8-format hybrid --fp8-recipe tensorwise)
  local state=(--use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16)
  bf16=$(run_shape bf16_gbs8 8); echo "megatron.cpp, global batch 8, bf16: tokens/s, TFLOP/s, max allocated MB = $bf16"
  fp8=$(run_shape fp8_gbs8 8 "${fp8_flags[@]}"); echo "megatron.cpp, global batch 8, FP8: tokens/s, TFLOP/s, max allocated MB = $fp8"
  bf16_state=$(run_shape bf16_state_gbs8 8 "${state[@]}")
  echo "megatron.cpp, global batch 8, bf16, bf16 gradients and moments: tokens/s, TFLOP/s, max allocated MB = $bf16_state"
  fp8_state=$(run_shape fp8_state_gbs8 8 "${fp8_flags[@]}" "${state[@]}")
  echo "megatron.cpp, global batch 8, FP8, bf16 gradients and moments: tokens/s, TFLOP/s, max allocated MB = $fp8_state"
  echo "RATIO FP8 / bf16: $(ratio "$fp8" "${bf16%% *}") (default state), $(ratio "$fp8_state" "${bf16_state%% *}") (bf16 gradients and moments)"
}
# At global batch 8 with the baseline's precision of optimizer state or better (as precision_only),
# the step eager and captured as one CUDA graph (--cuda-graph-impl local: the host launches nothing
# per kernel), against the caller's `hf` baseline compiled; the ratios. The graph's capture line
# is printed from the log: a run that fell back or failed shows none.
graph_only() {
  local eager graphed hf_compiled best
  local state=(--use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16)
  eager=$(run_shape bf16_state_gbs8 8 "${state[@]}")
  echo "megatron.cpp, global batch 8, real routing, bf16 gradients and moments, eager: tokens/s, TFLOP/s, max allocated MB = $eager"
  graphed=$(run_shape bf16_state_graph_gbs8 8 "${state[@]}" --cuda-graph-impl local)
  echo "megatron.cpp, global batch 8, real routing, bf16 gradients and moments, CUDA graph: tokens/s, TFLOP/s, max allocated MB = $graphed"
  grep "CUDA graph: captured" "$out/bf16_state_graph_gbs8.log" || echo "(no capture line in the log)"
  if [ "${GRAPH_BALANCED:-0}" = 1 ]; then  # the issue's force-balanced figure too (--moe-router-force-load-balancing)
    echo "megatron.cpp, global batch 8, force-balanced, bf16 gradients and moments, CUDA graph: tokens/s, TFLOP/s, max allocated MB =" \
         "$(run_shape balanced_graph_gbs8 8 "${state[@]}" --cuda-graph-impl local --moe-router-force-load-balancing)"
  fi
  hf_compiled=$(hf --compile --iters 10 --grad-accum 8); echo "$hf_compiled"
  best=$(hf_tokens "$hf_compiled" 8)
  echo "RATIO global batch 8, to HF compiled ($best tok/s): eager $(ratio "$eager" "$best"), CUDA graph $(ratio "$graphed" "$best")" \
       "(graph / eager $(ratio "$graphed" "${eager%% *}"))"
}
