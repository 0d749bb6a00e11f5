#!/usr/bin/env bash
# The main demo: trains the tiny Llama-architecture recipe on CPU, saves a checkpoint, resumes it.
#   scripts/demo.sh BUILD/megatron
set -euo pipefail
bin=${1:-build/megatron}
cd "$(dirname "$0")/.."
out=runs/demo
rm -rf "$out"
echo "== training the tiny CPU recipe (examples/tiny_cpu.yaml) on mock data"
"$bin" train --config examples/tiny_cpu.yaml --mock-data --train-iters 100 --log-interval 10 --eval-interval 50 \
  --save "$out/checkpoints" --save-interval 50 --tensorboard-dir "$out/tensorboard"
echo "== checkpoints under $out/checkpoints, TensorBoard events under $out/tensorboard"
