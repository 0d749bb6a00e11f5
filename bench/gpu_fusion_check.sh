#!/usr/bin/env bash
# End-to-end check of the fused kernels on the reference shape (examples/llama-1.1b-bench.yaml):
# 100 training steps with every fusion (RoPE, SwiGLU, cross entropy, gradient accumulation)
# against 100 steps of the unfused ATen path from the same initialization and data, and a second unfused run for the
# run-to-run noise of bf16 training on this GPU. Prints per-step loss differences.
#   bash bench/gpu_fusion_check.sh MEGATRON_BINARY PYTHON [OUT_DIR]
set -uo pipefail
bin=$1; py=$2; out=${3:-/tmp/fusion_check}
iters=${FUSION_CHECK_ITERS:-100}
mkdir -p "$out"; rm -f "$out"/*.jsonl
run() {  # name, extra flags...
  local name=$1; shift
  "$bin" train --config examples/llama-1.1b-bench.yaml --mock-data --train-iters "$iters" --log-interval 50 \
    --lr 3e-4 --lr-warmup-iters 10 --metrics-jsonl "$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1 \
    || { echo "fusion check: the $name run failed:"; tail -20 "$out/$name.log"; exit 1; }
}
unfused=(--no-rope-fusion --no-bias-swiglu-fusion --cross-entropy-loss-fusion false --no-gradient-accumulation-fusion)
run fused
run unfused "${unfused[@]}"
run unfused_again "${unfused[@]}"
for name in fused unfused; do  # steps 51-100 (each step also reads its loss back for the check)
  echo "$name: $(grep " iteration" "$out/$name.log" | tail -1 | sed -n 's/.*\(throughput (tokens\/s\/GPU): [0-9.]*\).*/\1/p')"
done
"$py" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def losses(name):
    return [json.loads(l)["lm_loss"] for l in open(f"{out}/{name}.jsonl")]
fused, unfused, again = losses("fused"), losses("unfused"), losses("unfused_again")
def compare(a, b):
    rel = [abs(x - y) / abs(y) for x, y in zip(a, b)]
    tail = lambda v: sum(v[-20:]) / 20
    return max(rel), sum(rel) / len(rel), abs(tail(a) - tail(b)) / tail(b)
print(f"steps: {len(fused)}; loss step 1 {unfused[0]:.4f} -> step {len(unfused)} {unfused[-1]:.4f} (unfused)")
print("| pair | max per-step relative difference | mean per-step | last-20 mean |")
print("|---|---|---|---|")
for name, (a, b) in {"fused vs unfused": (fused, unfused), "unfused vs unfused (run-to-run noise)": (again, unfused)}.items():
    mx, mean, tail = compare(a, b)
    print(f"| {name} | {mx:.2e} | {mean:.2e} | {tail:.2e} |")
mx, mean, tail = compare(fused, unfused)
# bf16 noise: per-step losses of two bf16 runs drift apart by up to ~1% once rounding differences
# compound; a formula error shows as a systematic gap in the trend or a blow-up.
ok = mx < 2e-2 and tail < 5e-3
print("fusion check:", "PASS" if ok else "FAIL", "(max per-step < 2e-2, last-20 mean < 5e-3)")
sys.exit(0 if ok else 1)
PY
