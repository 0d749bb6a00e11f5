#!/usr/bin/env bash
# Checkpoint cost on the 1.1B reference shape (one GPU): the training stall of a synchronous save
# against --async-save, same run length and save interval, in one call.
#   bash bench/gpu_checkpoint.sh MEGATRON_BINARY [SAVE_DIR]
set -uo pipefail
bin=$1; dir=${2:-/tmp/megatron-ckpt-bench}
iters=${BENCH_ITERS:-30}
run() {  # name flags...
  local name=$1; shift
  rm -rf "$dir"
  "$bin" train --config examples/llama-1.1b-bench.yaml --mock-data --train-iters "$iters" --log-interval 5 \
    --save "$dir" --save-interval 10 --keep-last-n 1 "$@" > "/tmp/$name.log" 2>&1 || { tail -20 "/tmp/$name.log"; return 1; }
  grep -E "saved checkpoint|started asynchronous|iteration +(5|10|15|20)/" "/tmp/$name.log" | sed 's/| throughput per GPU.*lm loss/| lm loss/'
  du -sh "$dir"/iter_* | tail -1
}
echo "== synchronous save"; run sync
echo "== --async-save"; run async --async-save
rm -rf "$dir"
