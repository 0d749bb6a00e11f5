#!/usr/bin/env bash
# Two-GPU runs (device kind nvidia-h200-x2), from the repository root:
#   bash bench/gpu_parallel.sh MEGATRON_BINARY PYTHON HF_BASELINE_SCRIPT
# 1. Parallel equivalence under NCCL in bf16: a small Llama-shaped model trained 20 steps under
#    TP=2, TP=2 + SP, DP=2, DP=2 + distributed optimizer and TP=2 with overlapped buckets must
#    give the 1-GPU bf16 losses within BF16_TOLERANCE (relative, per step; default 2e-2).
# 2. The 1.1B reference shape (examples/llama-1.1b-bench.yaml): tokens/s/GPU on 1 GPU, DP=2
#    (with and without the distributed optimizer) and TP=2 (with and without SP), and the
#    scaling efficiency of each against 1 GPU; the HF eager baseline on 1 GPU beside them.
set -uo pipefail
bin=$1; py=$2; baseline=$3
tolerance=${BENCH_BF16_TOLERANCE:-2e-2}
iters=${BENCH_ITERS:-30}
work=$(mktemp -d)
status=0

small=(--num-layers 4 --hidden-size 512 --num-attention-heads 8 --group-query-attention --num-query-groups 4
       --ffn-hidden-size 1408 --swiglu --normalization RMSNorm --position-embedding-type rope --seq-length 512
       --micro-batch-size 2 --global-batch-size 8 --train-iters 20 --lr 3e-4 --lr-warmup-iters 2 --mock-data
       --tokenizer-type NullTokenizer --vocab-size 4095 --log-interval 5 --eval-interval 0 --bf16
       --hidden-dropout 0 --attention-dropout 0 --device cuda --untie-embeddings-and-output-weights)
run_small() {  # name nproc flags...
  local name=$1 nproc=$2; shift 2
  if [ "$nproc" = 1 ]; then
    "$bin" train "${small[@]}" "$@" --metrics-jsonl "$work/$name.jsonl" > "$work/$name.log" 2>&1
  else
    "$bin" launch --nproc-per-node "$nproc" --master-port 0 train "${small[@]}" "$@" --metrics-jsonl "$work/$name.jsonl" \
      > "$work/$name.log" 2>&1
  fi || { echo "FAILED: $name"; tail -20 "$work/$name.log"; status=1; }
}
max_relative() {  # jsonl jsonl -> max over steps of |a - b| / |b|
  paste <(grep -o '"lm_loss": [0-9.eE+-]*' "$1" | awk '{print $2}') <(grep -o '"lm_loss": [0-9.eE+-]*' "$2" | awk '{print $2}') |
    awk 'BEGIN { m = 0; n = 0 } { d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > m) m = d; n++ } END { printf "%.2e %d", m, n }'
}

echo "== parallel equivalence under NCCL, bf16, 20 steps (tolerance $tolerance relative)"
run_small single 1
printf '| layout | max relative loss difference vs 1 GPU | steps | verdict |\n|---|---|---|---|\n'
for layout in "tp2:--tensor-model-parallel-size 2" "tp2_sp:--tensor-model-parallel-size 2 --sequence-parallel" \
              "dp2:" "dp2_distopt:--use-distributed-optimizer" \
              "dp2_distopt_overlap:--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 1000000"; do
  name=${layout%%:*}; flags=${layout#*:}
  # shellcheck disable=SC2086
  run_small "$name" 2 $flags
  read -r diff steps <<< "$(max_relative "$work/$name.jsonl" "$work/single.jsonl")"
  verdict=$(awk -v d="$diff" -v t="$tolerance" -v n="$steps" 'BEGIN { print (n == 20 && d <= t) ? "ok" : "FAIL" }')
  [ "$verdict" = ok ] || status=1
  printf '| %s | %s | %s | %s |\n' "$name" "$diff" "$steps" "$verdict"
done

echo; echo "== 1.1B reference shape, $iters iterations"
bench() {  # name nproc global-batch flags...
  local name=$1 nproc=$2 gbs=$3; shift 3
  local cmd=("$bin")
  [ "$nproc" = 1 ] || cmd+=(launch --nproc-per-node "$nproc" --master-port 0)
  "${cmd[@]}" train --config examples/llama-1.1b-bench.yaml --mock-data --train-iters "$iters" --log-interval 10 \
    --global-batch-size "$gbs" "$@" > "$work/$name.log" 2>&1 || { echo "FAILED: $name"; tail -20 "$work/$name.log"; status=1; }
  grep " iteration" "$work/$name.log" | tail -1 | sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p'
}
one=$(bench gpu1 1 4)
eager=$(PYTHONUNBUFFERED=1 "$py" "$baseline" --iters 10 2>&1 | tail -1 | sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p')
printf '| layout | GPUs | global batch | tokens/s/GPU | scaling efficiency vs 1 GPU |\n|---|---|---|---|---|\n'
printf '| HF eager baseline | 1 | 4 | %s | |\n| megatron.cpp | 1 | 4 | %s | 1.00 |\n' "$eager" "$one"
for layout in "DP=2:8:--overlap-grad-reduce" "DP=2 distributed optimizer:8:--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather" \
              "TP=2:4:--tensor-model-parallel-size 2" "TP=2 + SP:4:--tensor-model-parallel-size 2 --sequence-parallel"; do
  name=${layout%%:*}; rest=${layout#*:}; gbs=${rest%%:*}; flags=${rest#*:}
  # shellcheck disable=SC2086
  tok=$(bench "$(tr -c 'A-Za-z0-9' _ <<< "$name")" 2 "$gbs" $flags)
  printf '| megatron.cpp %s | 2 | %s | %s | %s |\n' "$name" "$gbs" "$tok" \
    "$(awk -v a="$tok" -v b="$one" 'BEGIN { if (b > 0 && a > 0) printf "%.3f", a / b; else print "n/a" }')"
done
for f in "$work"/*.log; do echo "--- $(basename "$f"): $(grep -m1 'parallel layout' "$f")"; grep " iteration" "$f" | tail -1; done
rm -rf "$work"
exit $status
