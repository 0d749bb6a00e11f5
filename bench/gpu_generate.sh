#!/usr/bin/env bash
# One H200: generation on the 1.1B reference shape (random weights, bf16; issue #23's figures)
# against HF transformers' generate (static cache, eager and torch.compile) in the same call.
#   bash bench/gpu_generate.sh MEGATRON_BINARY PYTHON TOKENIZER_JSON [OUT_DIR]
# The model is a random HF Llama of the shape (save_pretrained) with the Llama 2 tokenizer, read by
# `megatron generate --load-hf`. Ours: decode at batch 1 (ms a step: 256 new tokens), then 64
# prompts decoded together (128 new tokens each): output tokens/s with and without the prefills;
# each eagerly (--cuda-graph-impl none) and with decode graphs (the default on a GPU: attention over the
# cache in place). GENERATE_QUICK=1: only the default engine (batch 1 and 64) alternated with
# GENERATE_VARIANTS's flag sets (batch 1 GENERATE_ROUNDS rounds, default 3, batch 64 one; with GENERATE_BEFORE=BINARY
# also against that binary), and HF compiled (GENERATE_HF=0: not HF).
set -uo pipefail
bin=$(realpath "$1") py=$2 tokenizer=$3 out=${4:-/tmp/generate}
mkdir -p "$out"
"$py" - "$out/model" "$tokenizer" <<'PY'
import shutil, sys, torch, transformers
config = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                                  num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
                                  rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=2, bos_token_id=1)
torch.manual_seed(0)
transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1])
shutil.copy(sys.argv[2], f"{sys.argv[1]}/tokenizer.json")
PY
text=$(printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 12))
if [ "${GENERATE_PROFILE:-0}" = 1 ]; then
  # Where a decode step's time goes: engine steps 10 and 11 under the PyTorch profiler, batch 1 and 64.
  (cd "$out" && "$bin" generate --load-hf "$out/model" --bf16 --device cuda --greedy --ignore-eos --max-new-tokens 40 \
     --profile --prompt "$text" 2>&1 | grep "^>" | head -40)
  "$py" bench/trace_host_time.py "$out"/trace_rank0_iterations_10-11.json 2 30
  "$py" bench/trace_gpu_gaps.py "$out"/trace_rank0_iterations_10-11.json 2 15
  prompts=(); for i in $(seq 64); do prompts+=(--prompt "$i $text"); done
  (cd "$out" && "$bin" generate --load-hf "$out/model" --bf16 --device cuda --greedy --ignore-eos --max-new-tokens 40 \
     --inference-max-batch-size 64 --profile "${prompts[@]}" 2>&1 | grep "^>" | grep -v "^> [0-9]" | head -40)
  "$py" bench/trace_host_time.py "$out"/trace_rank0_iterations_10-11.json 2 15
  "$py" bench/trace_gpu_gaps.py "$out"/trace_rank0_iterations_10-11.json 2 8
  exit 0
fi
if [ "${GENERATE_QUICK:-0}" = 1 ]; then
  # The default engine (decode graphs) at batch 1 and 64 next to HF compiled: the figures that move.
  echo "megatron.cpp batch 1: $("$bin" generate --load-hf "$out/model" --bf16 --device cuda --greedy --ignore-eos \
    --max-new-tokens 256 --prompt "$text" 2>&1 >/dev/null | grep '^> prefill')"
  prompts=(); for i in $(seq 64); do prompts+=(--prompt "$i $text"); done
  echo "megatron.cpp batch 64: $("$bin" generate --load-hf "$out/model" --bf16 --device cuda --greedy --ignore-eos \
    --max-new-tokens 128 --inference-max-batch-size 64 "${prompts[@]}" 2>&1 >/dev/null | grep '^> prefill')"
  # The default alternated with the variants in GENERATE_VARIANTS (";"-separated flag sets; by
  # default the newer decode kernels, off by default, each alone and together): batch 1 moves by
  # up to 25% between runs of one binary, so rounds alternate.
  all_new="--attention-backend decode --decode-norms-in-gemv --decode-rope-in-gemv"
  IFS=';' read -r -a variants <<< "${GENERATE_VARIANTS:-;--attention-backend decode;--decode-norms-in-gemv;--decode-rope-in-gemv;$all_new}"
  for round in $(seq "${GENERATE_ROUNDS:-3}"); do
    for flags in "${variants[@]}"; do
      echo "megatron.cpp batch 1 ${flags:-(default)}: $("$bin" generate --load-hf "$out/model" --bf16 --device cuda --greedy \
        --ignore-eos --max-new-tokens 256 $flags --prompt "$text" 2>&1 >/dev/null | grep -o 'decode: .*')"
    done
  done
  for flags in "${variants[@]}"; do
    echo "megatron.cpp batch 64 ${flags:-(default)}: $("$bin" generate --load-hf "$out/model" --bf16 --device cuda --greedy --ignore-eos \
      --max-new-tokens 128 --inference-max-batch-size 64 $flags "${prompts[@]}" 2>&1 >/dev/null | grep -o 'decode: .*')"
  done
  # Fewer sequences, GENERATE_MID_BATCHES (default 16, where --attention-backend auto's choice
  # changes; each prompt is two words: --prompt and its text): two rounds.
  for round in 1 2; do
    for mid in ${GENERATE_MID_BATCHES:-16}; do
      for flags in "${variants[@]}"; do
        echo "megatron.cpp batch $mid ${flags:-(default)}: $("$bin" generate --load-hf "$out/model" --bf16 --device cuda --greedy --ignore-eos \
          --max-new-tokens 128 --inference-max-batch-size "$mid" $flags "${prompts[@]:0:$((2 * mid))}" 2>&1 >/dev/null | grep -o 'decode: .*')"
      done
    done
  done
  if [ -n "${GENERATE_BEFORE:-}" ]; then
    # An earlier commit's binary (run.sh builds .gpu/before's tree) alternated with this one's default.
    for round in 1 2 3; do
      for b in "$GENERATE_BEFORE" "$bin"; do
        echo "batch 1 $( [ "$b" = "$bin" ] && echo this || echo before ): $("$b" generate --load-hf "$out/model" --bf16 --device cuda --greedy \
          --ignore-eos --max-new-tokens 256 --prompt "$text" 2>&1 >/dev/null | grep -o 'decode: .*')"
      done
    done
    for b in "$GENERATE_BEFORE" "$bin"; do
      echo "batch 64 $( [ "$b" = "$bin" ] && echo this || echo before ): $("$b" generate --load-hf "$out/model" --bf16 --device cuda --greedy \
        --ignore-eos --max-new-tokens 128 --inference-max-batch-size 64 "${prompts[@]}" 2>&1 >/dev/null | grep -o 'decode: .*')"
    done
  fi
  # GENERATE_HF=0: no HF baseline (a quick comparison of our own variants, none of its ratios to HF).
  [ "${GENERATE_HF:-1}" = 0 ] || "$py" bench/hf_generate_baseline.py "$out/model" "$text" --compile 2>&1 | grep -E "baseline|Error"
  exit 0
fi
echo "megatron.cpp batch 1, --cuda-graph-impl none: $("$bin" generate --load-hf "$out/model" --bf16 --device cuda --greedy --ignore-eos \
  --max-new-tokens 256 --cuda-graph-impl none --prompt "$text" 2>&1 >/dev/null | grep '^> prefill')"
echo "megatron.cpp batch 1, --cuda-graph-impl local: $("$bin" generate --load-hf "$out/model" --bf16 --device cuda --greedy --ignore-eos \
  --max-new-tokens 256 --cuda-graph-impl local --prompt "$text" 2>&1 >/dev/null | grep '^> prefill')"
prompts=(); for i in $(seq 64); do prompts+=(--prompt "$i $text"); done
echo "megatron.cpp batch 64, --cuda-graph-impl none: $("$bin" generate --load-hf "$out/model" --bf16 --device cuda --greedy --ignore-eos \
  --max-new-tokens 128 --inference-max-batch-size 64 --cuda-graph-impl none "${prompts[@]}" 2>&1 >/dev/null | grep '^> prefill')"
echo "megatron.cpp batch 64, --cuda-graph-impl local: $("$bin" generate --load-hf "$out/model" --bf16 --device cuda --greedy --ignore-eos \
  --max-new-tokens 128 --inference-max-batch-size 64 --cuda-graph-impl local "${prompts[@]}" 2>&1 >/dev/null | grep '^> prefill')"
"$py" bench/hf_generate_baseline.py "$out/model" "$text" 2>&1 | grep -E "baseline|Error"
"$py" bench/hf_generate_baseline.py "$out/model" "$text" --compile 2>&1 | grep -E "baseline|Error"
