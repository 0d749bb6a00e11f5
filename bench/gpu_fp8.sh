#!/usr/bin/env bash
# Issue #24's FP8 figures on one GPU: the Llama-3-8B layer shape (hidden 4096, ffn 14336, 32 heads
# / 8 query groups, vocab 128256, seq 8192, micro-batch 1; FP8_LAYERS layers, default 8) trained
# in bf16 and with each FP8 recipe in the same call, from the same initialisation and data.
#   bash bench/gpu_fp8.sh MEGATRON_BINARY OUT_DIR speed|curve|both
# speed: tokens/s, TFLOP/s and peak allocated memory over the last 10 of 20 steps, each recipe's
#        ratio to bf16. curve: 200 steps of bf16 and of each recipe in FP8_CURVE_RECIPES (default
#        tensorwise), the losses into OUT_DIR/curve-NAME.jsonl and the largest relative difference
#        from bf16 over the steps (and over the last 50). The schedule: FP8_CURVE_LR (3e-4, cosine
#        to a tenth) after FP8_CURVE_WARMUP steps (20); FP8_CURVE_GBS sequences a step (1: one
#        8192-token sequence, where rounding alone parts two runs by a few percent; more lowers
#        that noise floor); FP8_CURVE_TAG names the files of one schedule (curve-TAG-NAME.jsonl)
#        so two schedules fit one call; FP8_CURVE_REUSE=DIR takes a run's losses from
#        DIR/curve-TAG-NAME.jsonl when it holds all 200 steps (an earlier call's), so the runs of one
#        schedule can be split over calls (bf16 is every comparison's reference).
#        FP8_CURVE_FROM=N: every run starts from one bf16 checkpoint after N steps of the same
#        schedule (saved once to FP8_CURVE_WARM_DIR, default /tmp/fp8-curve-warm-..., outside OUT_DIR:
#        ~34 GB at 8 layers with its optimizer state) and trains the 200 steps after it: the same
#        initialisation past the warm-up spike, where any two runs that differ in one bit part by
#        more than 1% whatever their precision (sessions 22 and 37).
set -uo pipefail
bin=$1; out=$2; what=${3:-speed}
mkdir -p "$out"
layers=${FP8_LAYERS:-8}
shape=(--config examples/llama3-8b.yaml --num-layers "$layers" --micro-batch-size 1 --global-batch-size 1 --device cuda
       --eval-interval 0 --log-throughput --cross-entropy-loss-fusion --hidden-dropout 0 --attention-dropout 0)
mock=(--tokenizer-type NullTokenizer --vocab-size 128255 --mock-data)
# FP8_DATA=DIR: the curves on DIR/brown_text_document (the Brown corpus in Llama 3's tokenizer,
# DIR/tokenizer.json; 1.3 M tokens: 200 steps of 8192 are 1.3 epochs) instead of mock data, whose
# random tokens leave nothing to learn.
data=("${mock[@]}")
[ -n "${FP8_DATA:-}" ] && data=(--data-path "$FP8_DATA/brown_text_document" --tokenizer-type HuggingFaceTokenizer
                                --tokenizer-model "$FP8_DATA" --split 100,0,0 --data-cache-path "$out/cache")
recipes=(${FP8_RECIPES:-bf16 tensorwise delayed blockwise})
flags_of() {
  case $1 in
    bf16) ;;
    # bf16 with the loss unfused (fp32 logits): the same model, data and schedule, differing from
    # bf16 only in rounding -- how far two runs part from that alone (the curves' noise floor).
    bf16-unfused) echo --cross-entropy-loss-fusion false ;;
    tensorwise) echo --fp8-format hybrid --fp8-recipe tensorwise ;;
    delayed) echo --fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 1024 --fp8-amax-compute-algo max ;;
    blockwise) echo --fp8-format e4m3 --fp8-recipe blockwise ;;
  esac
}
if [ "$what" = speed ] || [ "$what" = both ]; then
  printf '| run | tokens/s | vs bf16 | TFLOP/s | peak allocated (GiB) |\n|---|---|---|---|---|\n'
  base=0
  for r in "${recipes[@]}"; do
    # shellcheck disable=SC2046
    "$bin" train "${shape[@]}" "${mock[@]}" $(flags_of "$r") --train-iters 20 --log-interval 10 --lr 3e-4 --lr-warmup-iters 5 \
      > "$out/speed-$r.log" 2>&1 || { echo "FAILED: $r"; tail -20 "$out/speed-$r.log"; continue; }
    line=$(grep " iteration" "$out/speed-$r.log" | tail -1)
    tok=$(sed -n 's/.*throughput (tokens\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$line")
    tf=$(sed -n 's/.*throughput per GPU (TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p' <<< "$line")
    mem=$(grep -o 'max allocated: [0-9.]*' "$out/speed-$r.log" | head -1 | awk '{printf "%.1f", $3 / 1024}')
    [ "$r" = bf16 ] && base=$tok
    printf '| %s | %s | %s | %s | %s |\n' "$r" "$tok" "$(awk -v a="$tok" -v b="$base" 'BEGIN { if (b > 0) printf "%.3fx", a / b }')" "$tf" "$mem"
  done
  grep -h "notice: FP8\|FP8 GEMMs" "$out"/speed-*.log | sort -u
fi
if [ "$what" = curve ] || [ "$what" = both ]; then
  curves=(${FP8_CURVE_RECIPES:-tensorwise})
  lr=${FP8_CURVE_LR:-3e-4}; warmup=${FP8_CURVE_WARMUP:-20}; gbs=${FP8_CURVE_GBS:-1}
  min_lr=$(awk -v l="$lr" 'BEGIN { print l / 10 }')
  tag=${FP8_CURVE_TAG:+$FP8_CURVE_TAG-}
  from=${FP8_CURVE_FROM:-0}; iters=$(( from + 200 ))
  echo "curve schedule: lr $lr cosine to $min_lr over $iters steps after $warmup warm-up steps, global batch $gbs"
  start=()
  if [ "$from" -gt 0 ]; then
    warm=${FP8_CURVE_WARM_DIR:-/tmp/fp8-curve-warm-$layers-$gbs-$lr-$warmup-$from}
    if [ ! -f "$warm/latest_checkpointed_iteration.txt" ]; then
      "$bin" train "${shape[@]}" "${data[@]}" --global-batch-size "$gbs" --train-iters "$iters" --log-interval 10 --lr "$lr" \
        --min-lr "$min_lr" --lr-warmup-iters "$warmup" --exit-interval "$from" --save "$warm" > "$out/curve-${tag}start.log" 2>&1 \
        || { echo "FAILED: the first $from steps"; tail -20 "$out/curve-${tag}start.log"; exit 1; }
    fi
    echo "every run starts from $warm (bf16 after $from steps)"
    start=(--load "$warm")
  fi
  for r in bf16 "${curves[@]}"; do
    earlier=${FP8_CURVE_REUSE:+$FP8_CURVE_REUSE/curve-$tag$r.jsonl}
    if [ -n "$earlier" ] && [ -f "$earlier" ] && [ "$(grep -c '"lm_loss"' "$earlier")" -ge 200 ]; then
      cp "$earlier" "$out/curve-$tag$r.jsonl"; echo "$r: the losses of $earlier (not run again)"; continue
    fi
    # shellcheck disable=SC2046
    "$bin" train "${shape[@]}" "${data[@]}" "${start[@]}" $(flags_of "$r") --global-batch-size "$gbs" --train-iters "$iters" \
      --log-interval 50 --lr "$lr" --min-lr "$min_lr" \
      --lr-warmup-iters "$warmup" --metrics-jsonl "$out/curve-$tag$r.jsonl" > "$out/curve-$tag$r.log" 2>&1 \
      || { echo "FAILED: $r"; tail -20 "$out/curve-$tag$r.log"; }
  done
  for r in "${curves[@]}"; do
    paste <(grep -o '"lm_loss": [0-9.eE+-]*' "$out/curve-$tag$r.jsonl" | awk '{print $2}') \
          <(grep -o '"lm_loss": [0-9.eE+-]*' "$out/curve-${tag}bf16.jsonl" | awk '{print $2}') |
      awk -v r="$tag$r" '{ d = ($1 - $2) / $2; if (d < 0) d = -d; if (d > m) m = d; if (NR > 150 && d > t) t = d; n++; a += $1; b += $2 }
                     END { printf "%s: %d steps, largest relative difference from bf16 %.2e (last 50 steps %.2e), mean loss %.4f vs %.4f\n", r, n, m, t, a / n, b / n }'
  done
fi
