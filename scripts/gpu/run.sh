#!/usr/bin/env bash
# Run on the GPU machine (device tool), from the repository root, with .gpu carried:
#   bash scripts/gpu/run.sh [bench|test|fusion|all|parallel|pipeline|checkpoint|profile|scaling PART]
# `parallel` (two GPUs, nvidia-h200-x2): the NCCL equivalence checks and the 2-GPU benchmark
# (bench/gpu_parallel.sh). `pipeline` (two GPUs): NCCL pipeline equivalence and the measured
# bubble (bench/gpu_pipeline.sh). `profile`: where a step's time goes on the 1.1B shape
# (`train --profile`, iterations 10-11, kernel table and Chrome trace into $OUT). `checkpoint`: the save stall, synchronous vs --async-save
# (bench/gpu_checkpoint.sh). `fusion`: 100 steps of the reference shape with the fused kernels
# against the unfused path (bench/gpu_fusion_check.sh; ~4 minutes, so a call of its own).
# `all`: build, GPU tests (the fused kernels' CUDA tests among them), benchmark. The default
# selection is the tests that use the GPU; the CPU suites (TrainingRuns, TensorBoard, HfParity,
# ParallelEquivalence, ...) run in CI. In this image std::filesystem calls made by the test
# binary crash: the tests' temporary directories now use POSIX calls, and a GPU_TESTS selection
# of those suites passed here (docs/performance.md).
# `zero-weights`: the reference step with all-zero weights against the normal initialisation
# and the HF torch.compile baseline the same two ways (same kernels and bytes, operands that toggle no
# bits), with power and clock: is the step power-bound?
# `gemm-algos` (after a build): cuBLASLt's first-ranked algorithm against the fastest of its
# candidates for each GEMM of the step (bench/gpu_gemm_algos.cu), then bench/gpu_gemm_ceiling.py.
# `scaling PART` (4 or 8 GPUs): bench/gpu_scaling.sh's equivalence, dp, bubble or 8b runs.
# `dp2` (two GPUs): only the DP=2 scaling figures (1 GPU vs DP=2 with the distributed optimizer,
# overlapped; fp32 and --grad-reduce-in-bf16 gradients, each against one GPU with the same flags), building the megatron binary
# alone: the cheapest check of that target. `build`: only the megatron binary, for commands that follow.
# `recompute` (after `build`): the reference shape without / with selective / with full activation
# recomputation: tokens/s, peak memory and activations at peak. `overlap`: the optimizer step serial
# and overlapped with the next forward, alternated twice (`test-overlap`: the GPU tests first).
# `context-parallel`: the binary, the test program and the ring-attention bench; the CP CUDA tests
# (flash blocks against the arithmetic), then bench/gpu_context_parallel.sh: issue #22's ring
# blocks against one fused attention at seq 32k-128k, and the 1.1B shape at seq 32k and 64k
# against HF + torch.compile.
# `generate-test`: the binary and the test program, the generation CUDA tests, the decode kernels against
# what they replace (bench/decode_kernels_bench.cpp), then `generate`'s figures. `generate-bench`: the
# binary and the kernels bench, no tests: the bench, GENERATE_QUICK's figures, then GENERATE_PROFILE's.
# `decode-kernels`: only the kernels bench (DECODE_BENCH_FLAGS, e.g. "--only step").
# `generate` (the megatron binary only): bench/gpu_generate.sh, decode latency and batched throughput on
# the 1.1B shape against HF generate. `open-figures` (the binary and the ring bench): what issues #22
# and #23 wait for an H200 for, in one call: decode next to HF compiled, then the ring at 32k-128k.
# `plan-check` (the megatron binary only): bench/gpu_plan_check.sh, `megatron plan`'s memory estimate
# against the peak of a short run, on shapes its tests were not calibrated on.
# `ring-figure` (the ring bench only): issue #22's figure, the ring at 32k three times, then 64k.
# `cp-test` (the test program only): the context-parallel CUDA tests (GPU_TESTS narrows or widens them),
# the cheapest check of a change to the ring's kernels (src/kernels/attention_merge.cu).
# `moe-precision` (the megatron binary only): both MoE shapes at global batch 8 with bf16 gradients and
# Adam moments against the default and HF compiled (PRECISION_ONLY in bench/gpu_moe.sh, gpu_deepseek.sh).
# `moe-graph`: the binary and the test program, the MoE CUDA tests (GPU_TESTS), then both MoE shapes (MOE_GRAPH_SHAPES)
# at global batch 8 with bf16 optimizer state, eager against one CUDA graph a step, and HF compiled (GRAPH_ONLY).
# `moe-fp8` (the megatron binary only): both MoE shapes at global batch 8 in bf16 and in FP8 (issue #24's
# FP8 grouped GEMMs for the experts), each with default and bf16 optimizer state (FP8_ONLY).
# `moe-test`: the whole build and the MoE and other CUDA tests. `moe` (the megatron binary only):
# bench/gpu_moe.sh: the Qwen3-30B-A3B layer shape (6 layers) against HF transformers' Qwen3-MoE
# (grouped_mm experts, eager and torch.compile) at global batches 1 and 8, real routing and
# force-balanced, and a profile of where the step's time goes. Two calls: each fits the 10 minutes.
# `deepseek` (the megatron binary only): bench/gpu_deepseek.sh, issue #21's DeepSeek-V2-Lite layer
# shape against HF's DeepseekV2 (not yet run in full on a GPU). `deepseek-short`: the same comparison
# in fewer steps, the most telling runs first (bench/gpu_deepseek_short.sh; ~5 minutes with the build).
# `memory` (the megatron binary only): bench/gpu_memory.sh, issue #24's 2B Qwen3-sized shape with
# fp32 and with bf16 optimizer state against HF eager and torch.compile (tokens/s, peak memory).
# `precision-test`: the whole build, the CUDA tests (fp16, bf16 moments among them), then `memory`.
# `fp8`: the whole build, the FP8 CUDA tests and the other CUDA tests, then bench/gpu_fp8.sh speed
# (FP8_BENCH=both: and the curves): the Llama-3-8B layer shape in bf16 and with each FP8 recipe. `fp8-curve` (the megatron binary
# only): bench/gpu_fp8.sh curve, 200 steps of each from the same initialisation.
# `fp8-layers`: the whole build, the CUDA tests, then bench/gpu_fp8.sh speed (bf16, tensorwise,
# delayed) at 8 and at 20 layers of the Llama-3-8B shape (FP8_LAYER_COUNTS).
# `activation-offload`: the whole build, the CUDA tests (GPU_TESTS), then bench/gpu_activation_offload.sh
# (--cpu-offloading on the 2B shape: 0, 7, 14 and 27 of 28 layers).
# `offload-test`: the whole build, the CUDA tests (the offloaded optimizer and the freed
# layernorm / moe_act outputs among them; GPU_TESTS narrows them). `offload` (the megatron binary
# only): bench/gpu_offload.sh, the 8B shape cut down to 8 layers on the device against all 32
# layers with --optimizer-cpu-offload (tokens/s per layer, peak device memory, host RSS).
# `before-after`: the tree in .gpu/before (scripts/gpu/prepare.sh BEFORE_COMMIT puts it there) built
# too, the GPU tests of this tree, then bench/gpu_ab.sh: both binaries alternated on the reference
# shape next to the HF torch.compile baseline (is a change speed-neutral?).
# Builds megatron.cpp against the machine's CUDA LibTorch, runs the test suite on the GPU
# machine, then benchmarks (bench/gpu_bench.sh). Logs go to $OUT when set.
set -uo pipefail
what=${1:-all}
out=${OUT:-/tmp/out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/cuda/bin:$PATH
py=/opt/torch/.venv/bin/python3; [ -x "$py" ] || py=python3
torch_root=$($py -c 'import torch, os; print(os.path.dirname(torch.__file__))')
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "torch: $($py -c 'import torch; print(torch.__version__, torch.cuda.device_count(), "GPUs")')"

# The GPU tests matching GPU_TESTS, else the mode's default regex ($1), $3 at a time (default 8),
# into $out/ctest.log; its last $2 lines shown.
gpu_tests() {
  (cd build-gpu && ctest -j "${3:-8}" --timeout 600 --output-on-failure -R "${GPU_TESTS:-$1}" > "$out/ctest.log" 2>&1); tail -"$2" "$out/ctest.log"
}

start=$(date +%s)
cutlass=()  # CUTLASS's headers, packed by prepare.sh: the kernels of src/kernels/cutlass/
if [ -f .gpu/cutlass.tgz ]; then
  mkdir -p build-gpu/cutlass && tar -xzf .gpu/cutlass.tgz -C build-gpu/cutlass && cutlass=(-DMEGATRON_CUTLASS_DIR="$PWD/build-gpu/cutlass")
fi
cmake -S . -B build-gpu -G Ninja -DMEGATRON_CUDA=ON "${cutlass[@]}" -DTORCH_ROOT="$torch_root" -DMEGATRON_DEPS_DIR="$PWD/.gpu/deps" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DMEGATRON_VENV="$(dirname "$(dirname "$py")")" > "$out/configure.log" 2>&1 \
  || { tail -40 "$out/configure.log"; exit 1; }
targets=(); case $what in generate-test) targets=(--target megatron megatron_tests megatron_bench_decode_kernels) ;; esac
case $what in moe-graph) targets=(--target megatron megatron_tests megatron_bench_decode_kernels) ;; esac
case $what in generate-bench) targets=(--target megatron megatron_bench_decode_kernels) ;; esac
case $what in decode-kernels) targets=(--target megatron_bench_decode_kernels) ;; esac
case $what in context-parallel) targets=(--target megatron megatron_tests megatron_bench_context_attention) ;; esac
case $what in open-figures) targets=(--target megatron megatron_bench_context_attention) ;; esac
case $what in ring-figure) targets=(--target megatron_bench_context_attention) ;; esac
case $what in cp-test) targets=(--target megatron_tests) ;; esac
case $what in dp2|build|gemm-algos|bench|zero-weights|moe|deepseek|deepseek-short|memory|fp8-curve|offload|moe-precision|moe-fp8|generate|plan-check) targets=(--target megatron) ;; esac
# EXTRA_TARGETS: more to build with a mode's own (e.g. a second bench for the same call).
if [ ${#targets[@]} -gt 0 ]; then for t in ${EXTRA_TARGETS:-}; do targets+=(--target "$t"); done; fi
cmake --build build-gpu -j "$(nproc)" "${targets[@]}" > "$out/build.log" 2>&1 || { grep -E "error|Error" -A3 "$out/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

if [ "$what" = before-after ]; then
  [ -d .gpu/before ] || { echo "no .gpu/before: run scripts/gpu/prepare.sh BEFORE_COMMIT here first"; exit 1; }
  # Built in build-before (outside .gpu, which a carry replaces), so a second call reuses it.
  (cmake -S .gpu/before -B build-before -G Ninja -DMEGATRON_CUDA=ON -DTORCH_ROOT="$torch_root" -DMEGATRON_DEPS_DIR="$PWD/.gpu/deps" \
     -DCMAKE_CUDA_ARCHITECTURES=90 -DMEGATRON_VENV="$(dirname "$(dirname "$py")")" > "$out/configure-before.log" 2>&1 &&
   cmake --build build-before -j "$(nproc)" --target megatron > "$out/build-before.log" 2>&1) \
    || { grep -E "error|Error" -A3 "$out/build-before.log" | head -40; exit 1; }
  echo "build (before): $(( $(date +%s) - start )) s"
  gpu_tests "Cuda|LayerReference|LayerSpec|FiniteDiff|GradAccumulation|GradBuffer" 8
  bash bench/gpu_ab.sh build-before/megatron build-gpu/megatron "$py" .gpu/hf_baseline.py 2>&1 | tee "$out/before-after.log"
fi
if [ "$what" = plan-check ]; then
  bash bench/gpu_plan_check.sh build-gpu/megatron 2>&1 | tee "$out/plan-check.log"
fi
if [ "$what" = checkpoint ]; then
  bash bench/gpu_checkpoint.sh build-gpu/megatron 2>&1 | tee "$out/checkpoint.log"
fi
if [ "$what" = parallel ]; then
  gpu_tests "Cuda" 5
  bash bench/gpu_parallel.sh build-gpu/megatron "$py" .gpu/hf_baseline.py 2>&1 | tee "$out/parallel.log"
fi
if [ "$what" = dp2 ]; then
  bin=build-gpu/megatron work=$(mktemp -d) iters=${BENCH_ITERS:-30} status=0
  source bench/lib.sh
  extra=(${DP2_FLAGS:-})  # e.g. --overlap-optimizer-step, given to all four
  one=$(bench gpu1 1 4 "${extra[@]}")
  two=$(bench dp2_distopt 2 8 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "${extra[@]}")
  one_bf16=$(bench gpu1_bf16_grads 1 4 --grad-reduce-in-bf16 "${extra[@]}")
  bf16=$(bench dp2_distopt_bf16_grads 2 8 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --grad-reduce-in-bf16 "${extra[@]}")
  efficiency() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.3f", a / b }'; }
  echo "fp32 gradients: 1 GPU $one tokens/s, DP=2 distributed optimizer $two tokens/s/GPU, efficiency $(efficiency "$two" "$one")"
  echo "--grad-reduce-in-bf16: 1 GPU $one_bf16 tokens/s, DP=2 distributed optimizer $bf16 tokens/s/GPU," \
       "efficiency $(efficiency "$bf16" "$one_bf16") (against the fp32-gradient GPU: $(efficiency "$bf16" "$one"))"
fi
if [ "$what" = recompute ]; then
  # What activation recomputation costs and saves on the reference shape (one GPU).
  bin=build-gpu/megatron work=$(mktemp -d) iters=${BENCH_ITERS:-30} status=0
  source bench/lib.sh
  for variant in "none:" "selective:--recompute-granularity selective" \
                 "full uniform 1:--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"; do
    name=${variant%%:*}
    tokens=$(bench recompute 1 4 ${variant#*:})
    echo "recompute $name: $tokens tokens/s, $(grep -o 'max allocated: [0-9.]*\|activations at peak: [0-9.]*' "$work/recompute.log" | head -2 | paste -sd ' ') MB"
  done
fi
if [ "$what" = overlap ] || [ "$what" = test-overlap ]; then
  # The optimizer step serial and overlapped with the next forward (--overlap-optimizer-step),
  # alternated twice on the reference shape (one GPU): the difference against the run-to-run noise.
  bin=build-gpu/megatron work=$(mktemp -d) iters=${BENCH_ITERS:-30} status=0
  source bench/lib.sh
  for round in 1 2; do
    for variant in "serial:" "overlapped:--overlap-optimizer-step"; do
      echo "optimizer step ${variant%%:*} (round $round): $(bench overlap 1 4 ${variant#*:}) tokens/s, $(grep -o "initialised the weights in [0-9.]* s" "$work/overlap.log")"
    done
  done
  for variant in "serial:" "overlapped:--overlap-optimizer-step"; do
    echo "CUDA graph step, optimizer step ${variant%%:*}: $(bench overlap 1 4 --cuda-graph-impl local ${variant#*:}) tokens/s"
  done
fi
if [ "$what" = profile ]; then
  build-gpu/megatron train --config examples/llama-1.1b-bench.yaml --mock-data --train-iters 14 --log-interval 7 \
    --profile --profile-step-start 10 --profile-step-end 12 --tensorboard-dir "$out" ${PROFILE_FLAGS:-} 2>&1 | tee "$out/profile.log" | grep -v "^ iteration"
fi
if [ "$what" = zero-weights ]; then
  # Is the step limited by power? The same step (same kernels, same shapes, same bytes) with
  # every weight zero (--init-method-std 0: all GEMM operands zero, gradients zero) against the
  # normal initialisation, and the HF torch.compile baseline the same two ways
  # (bench/hf_baseline_zero_weights.py), with the GPU's power and SM clock sampled.
  bin=build-gpu/megatron work=$(mktemp -d) iters=${BENCH_ITERS:-30} status=0
  source bench/lib.sh
  sampled() {  # label command... -> "label: tokens/s, power / clock" (the command prints tokens/s last)
    local label=$1; shift
    nvidia-smi --query-gpu=power.draw,clocks.sm --format=csv,noheader,nounits -lms 100 > "$work/power" & local sampler=$!
    local tokens; tokens=$("$@" | tail -1); kill $sampler; wait $sampler 2>/dev/null
    echo "$label: $tokens tokens/s, $(power_summary "$work/power")" | tee -a "$out/zero-weights.log"
  }
  hf() { "$py" "$@" 2>&1 | tail -1 | sed -n 's/.* \([0-9]*\) tok\/s.*/\1/p'; }
  sampled "megatron.cpp, normal init" bench zero 1 4
  sampled "megatron.cpp, zero weights" bench zero 1 4 --init-method-std 0
  sampled "HF torch.compile, normal init" hf .gpu/hf_baseline.py --compile --iters 10
  sampled "HF torch.compile, zero weights" hf bench/hf_baseline_zero_weights.py .gpu/hf_baseline.py --compile --iters 10
  sampled "megatron.cpp, normal init (again)" bench zero 1 4
  sampled "megatron.cpp, zero weights (again)" bench zero 1 4 --init-method-std 0
fi
if [ "$what" = gemm-algos ]; then
  # cuBLASLt's heuristic first choice against the fastest of its candidates for the step's GEMMs
  # (bench/gpu_gemm_algos.cu), next to the same GEMMs through torch (bench/gpu_gemm_ceiling.py).
  nvcc -O2 -arch=sm_90 bench/gpu_gemm_algos.cu -lcublasLt -o build-gpu/gemm_algos 2>&1 | grep -v "^$" | head -20
  build-gpu/gemm_algos ${GEMM_ALGOS_FLAGS:-} 2>&1 | tee "$out/gemm_algos.log"
  $py bench/gpu_gemm_ceiling.py 2>&1 | tee "$out/gemm_ceiling.log"
fi
if [ "$what" = scaling ]; then
  bash bench/gpu_scaling.sh build-gpu/megatron "${2:?scaling needs a part: equivalence, dp, bubble or 8b}" 2>&1 | tee "$out/scaling-$2.log"
fi
if [ "$what" = pipeline ]; then
  bash bench/gpu_pipeline.sh build-gpu/megatron 2>&1 | tee "$out/pipeline.log"
fi
if [ "$what" = test ] || [ "$what" = all ] || [ "$what" = test-overlap ]; then
  gpu_tests "Cuda|LayerReference|FiniteDiff|GradAccumulation|GradBuffer" 15
fi
if [ "$what" = fusion ]; then
  bash bench/gpu_fusion_check.sh build-gpu/megatron "$py" "$out/fusion" 2>&1 | tee "$out/fusion.log"
fi
if [ "$what" = moe-test ]; then
  gpu_tests "MoeCuda|Cuda" 12
fi
if [ "$what" = deepseek ]; then
  bash bench/gpu_deepseek.sh build-gpu/megatron "$py" "$out/deepseek" 2>&1 | tee "$out/deepseek.log"
fi
if [ "$what" = precision-test ]; then
  gpu_tests "Cuda" 8
  grep -h "largest relative loss difference" "$out/ctest.log"
  bash bench/gpu_memory.sh build-gpu/megatron "$py" .gpu/hf_baseline.py 2>&1 | tee "$out/memory.log"
fi
if [ "$what" = fp8 ]; then
  gpu_tests "Fp8Cuda|Cuda" 8
  grep -h "notice: FP8" "$out/ctest.log" | sort -u
  bash bench/gpu_fp8.sh build-gpu/megatron "$out/fp8" "${FP8_BENCH:-speed}" 2>&1 | tee "$out/fp8.log"
fi
if [ "$what" = fp8-layers ]; then
  # The CUDA tests (GPU_TESTS narrows them), then bench/gpu_fp8.sh speed at each of FP8_LAYER_COUNTS
  # (default 8 and 20: the cut-down shape of earlier figures and about as many layers as fit one
  # H200 with the default optimizer).
  gpu_tests "Cuda" 8
  grep -E "Failed|FAILED" "$out/ctest.log" | head -20
  for n in ${FP8_LAYER_COUNTS:-8 20}; do
    echo "== $n layers"
    FP8_LAYERS=$n FP8_RECIPES="${FP8_RECIPES:-bf16 tensorwise delayed}" bash bench/gpu_fp8.sh build-gpu/megatron "$out/fp8-$n" speed 2>&1 | tee "$out/fp8-$n.log"
  done
fi
if [ "$what" = activation-offload ]; then
  gpu_tests "Cuda" 8
  grep -E "Failed|FAILED" "$out/ctest.log" | head -20
  bash bench/gpu_activation_offload.sh build-gpu/megatron 2>&1 | tee "$out/activation-offload.log"
fi
if [ "$what" = offload-test ]; then
  gpu_tests "Cuda" 8
  grep -E "Failed|FAILED" "$out/ctest.log" | head -20
fi
if [ "$what" = offload ]; then
  bash bench/gpu_offload.sh build-gpu/megatron "$out/offload" 2>&1 | tee "$out/offload.log"
fi
if [ "$what" = fp8-curve ]; then
  bash bench/gpu_fp8.sh build-gpu/megatron "$out/fp8" curve 2>&1 | tee "$out/fp8-curve.log"
fi
if [ "$what" = memory ]; then
  bash bench/gpu_memory.sh build-gpu/megatron "$py" .gpu/hf_baseline.py 2>&1 | tee "$out/memory.log"
fi
if [ "$what" = deepseek-short ]; then
  bash bench/gpu_deepseek_short.sh build-gpu/megatron "$py" "$out" 2>&1 | tee "$out/deepseek-short.log"
fi
if [ "$what" = context-parallel ]; then
  gpu_tests "ContextParallelCuda" 12 4
  bash bench/gpu_context_parallel.sh build-gpu "$py" .gpu/hf_baseline.py 2>&1 | tee "$out/context-parallel.log"
fi
if [ "$what" = generate-test ]; then
  # The generation CUDA tests (GPU_TESTS narrows them), then the generation figures.
  gpu_tests "GenerationCuda|CudaParity" 12 4
  # The decode step's kernels against what they replace (bench/decode_kernels_bench.cpp).
  build-gpu/megatron_bench_decode_kernels ${DECODE_BENCH_FLAGS:-} 2>&1 | tee "$out/decode-kernels.log"
  # GENERATE_FIGURES=0: the tests and the kernels bench only (generate-bench times the rest);
  # quick: then GENERATE_QUICK's figures (the default against GENERATE_VARIANTS, HF compiled).
  case "${GENERATE_FIGURES:-1}" in
    0) ;;
    quick) GENERATE_QUICK=1 bash bench/gpu_generate.sh build-gpu/megatron "$py" .gpu/tokenizer-llama2.json /tmp/generate 2>&1 | tee "$out/generate.log" ;;
    *) bash bench/gpu_generate.sh build-gpu/megatron "$py" .gpu/tokenizer-llama2.json /tmp/generate 2>&1 | tee "$out/generate.log" ;;
  esac
fi
if [ "$what" = decode-kernels ]; then
  build-gpu/megatron_bench_decode_kernels ${DECODE_BENCH_FLAGS:-} 2>&1 | tee "$out/decode-kernels.log"
fi
if [ "$what" = generate-bench ]; then
  # No tests: the decode kernels' bench, the quick generation figures (against .gpu/before's
  # binary too where scripts/gpu/prepare.sh BEFORE_COMMIT put a tree there), then where a step goes.
  before=""
  if [ -d .gpu/before ]; then
    (cmake -S .gpu/before -B build-before -G Ninja -DMEGATRON_CUDA=ON -DTORCH_ROOT="$torch_root" -DMEGATRON_DEPS_DIR="$PWD/.gpu/deps" \
       -DCMAKE_CUDA_ARCHITECTURES=90 -DMEGATRON_VENV="$(dirname "$(dirname "$py")")" > "$out/configure-before.log" 2>&1 &&
     cmake --build build-before -j "$(nproc)" --target megatron > "$out/build-before.log" 2>&1) \
      || { grep -E "error|Error" -A3 "$out/build-before.log" | head -40; exit 1; }
    echo "build (before): $(( $(date +%s) - start )) s"
    before=$(realpath build-before/megatron)
  fi
  build-gpu/megatron_bench_decode_kernels ${DECODE_BENCH_FLAGS:-} 2>&1 | tee "$out/decode-kernels.log"
  GENERATE_BEFORE=$before GENERATE_QUICK=1 bash bench/gpu_generate.sh build-gpu/megatron "$py" .gpu/tokenizer-llama2.json /tmp/generate 2>&1 | tee "$out/generate.log"
  if [ "${GENERATE_NO_PROFILE:-0}" != 1 ]; then
    GENERATE_PROFILE=1 bash bench/gpu_generate.sh build-gpu/megatron "$py" .gpu/tokenizer-llama2.json /tmp/generate > "$out/generate-profile.log" 2>&1
    grep -A24 "profile of iterations" "$out/generate-profile.log" | head -26
  fi
fi
if [ "$what" = generate ]; then
  # Issue #23's generation figures on the 1.1B shape against HF generate (bench/gpu_generate.sh).
  bash bench/gpu_generate.sh build-gpu/megatron "$py" .gpu/tokenizer-llama2.json /tmp/generate 2>&1 | tee "$out/generate.log"
fi
if [ "$what" = open-figures ]; then
  # What issues #22 and #23 still wait for, in one call of the 10 minutes (~8 with the build): batch-1
  # and batched decode next to HF's compiled generate, then the ring against one fused attention at
  # 32k-128k on 2, 4 and 8 ranks. Each part bounded, its log in $OUT as it goes.
  timeout 240 env GENERATE_QUICK=1 GENERATE_ROUNDS=2 GENERATE_VARIANTS=";--no-decode-norms-in-gemv" bash bench/gpu_generate.sh build-gpu/megatron "$py" \
    .gpu/tokenizer-llama2.json /tmp/generate 2>&1 | grep -v "batch 16" | tee "$out/generate.log"
  timeout 170 build-gpu/megatron_bench_context_attention --iters 4 --rounds 3 --document-tokens 0 2>&1 | tee "$out/ring.log"
fi
if [ "$what" = cp-test ]; then
  gpu_tests "ContextParallelCuda" 12
fi
if [ "$what" = ring-figure ]; then
  # Issue #22's open figure alone (~5 minutes with the build of the bench only): the ring against one
  # fused attention at 32k on 2, 4 and 8 ranks, three runs (the paired timing of session 47), then 64k
  # (RING_64K=0 leaves it out, RING_RUNS=1 takes 32k once, where device time is short).
  for run in $(seq "${RING_RUNS:-3}"); do
    timeout 90 build-gpu/megatron_bench_context_attention --iters 6 --rounds 5 --longest 32768 --document-tokens 0 2>&1 | tee "$out/ring-32k-$run.log"
  done
  [ "${RING_64K:-1}" = 0 ] || timeout 100 build-gpu/megatron_bench_context_attention --iters 3 --rounds 3 --shortest 65536 --longest 65536 --document-tokens 0 2>&1 | tee "$out/ring-64k.log"
fi
if [ "$what" = moe-precision ]; then
  # Both MoE shapes at global batch 8: default optimizer state, bf16 gradients and moments, HF compiled.
  PRECISION_ONLY=1 bash bench/gpu_moe.sh build-gpu/megatron "$py" /tmp/moe 2>&1 | tee "$out/moe-precision.log"
  PRECISION_ONLY=1 bash bench/gpu_deepseek.sh build-gpu/megatron "$py" /tmp/deepseek 2>&1 | tee "$out/deepseek-precision.log"
fi
if [ "$what" = moe-graph ]; then
  # The MoE CUDA tests (the captured step against the eager one among them), then both MoE shapes at
  # global batch 8 with bf16 gradients and moments, eager and as one CUDA graph a step, and HF compiled.
  gpu_tests "MoeCuda" 8 4; grep "largest relative difference" build-gpu/Testing/Temporary/LastTest.log 2>/dev/null | head -12
  for shape in ${MOE_GRAPH_SHAPES:-moe deepseek}; do
    GRAPH_ONLY=1 bash "bench/gpu_$shape.sh" build-gpu/megatron "$py" "/tmp/$shape" 2>&1 | tee "$out/$shape-graph.log"
  done
fi
if [ "$what" = moe-fp8 ]; then
  # Both MoE shapes at global batch 8 in bf16 and with FP8 GEMMs (the experts' grouped FP8 GEMMs).
  FP8_ONLY=1 bash bench/gpu_moe.sh build-gpu/megatron "$py" /tmp/moe 2>&1 | tee "$out/moe-fp8.log"
  FP8_ONLY=1 bash bench/gpu_deepseek.sh build-gpu/megatron "$py" /tmp/deepseek 2>&1 | tee "$out/deepseek-fp8.log"
fi
if [ "$what" = moe ]; then
  # Logs to /tmp, the summary and the profile's kernel table to $OUT (few files come back).
  bash bench/gpu_moe.sh build-gpu/megatron "$py" /tmp/moe 2>&1 | tee "$out/moe.log"
  cp /tmp/moe/profile.log "$out/moe-profile.log" 2>/dev/null
  cp /tmp/moe/profile8.log "$out/moe-profile-gbs8.log" 2>/dev/null
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  bash bench/gpu_bench.sh build-gpu/megatron "$py" .gpu/hf_baseline.py 2>&1 | tee "$out/bench.log"
fi
