"""Renders Megatron-LM's training log line (megatron/training/training.py, training_log) from the
values a test gives, for tests/train/test_log_line.cpp to compare with megatron.cpp's.

  python megatron_log_line.py JSON
JSON: {"time_us", "iteration", "train_iters", "consumed", "elapsed_s", "log_throughput", "tflops",
"lr", "batch", "losses": [[name, value], ...], "loss_scale", "skipped", "nan"}, and optionally
"grad_norm" (absent when the step was skipped), "num_zeros" (--log-num-zeros-in-grad: Megatron's
count, a Python float) and "params_norm" (--log-params-norm).
Each field is Megatron's own format specification, in Megatron's order.
"""
import json
import sys
from datetime import datetime

v = json.loads(sys.argv[1])
line = f" [{datetime.fromtimestamp(v['time_us'] // 1000000).replace(microsecond=v['time_us'] % 1000000).strftime('%Y-%m-%d %H:%M:%S.%f')}]"
line += " iteration {:8d}/{:8d} |".format(v["iteration"], v["train_iters"])
line += " consumed samples: {:12d} |".format(v["consumed"])
line += " elapsed time per iteration (ms): {:.1f} |".format(v["elapsed_s"] * 1000.0)
if v["log_throughput"]:
    line += f" throughput per GPU (TFLOP/s/GPU): {v['tflops']:.1f} |"
line += f" learning rate: {v['lr']:.6E} |"
line += f" global batch size: {v['batch']:5d} |"
for name, value in v["losses"]:
    line += " {}: {:.6E} |".format(name, value)
line += f" loss scale: {v['loss_scale']:.1f} |"
if "grad_norm" in v:  # Megatron's optimizer returns none for a skipped step
    line += f" grad norm: {v['grad_norm']:.3f} |"
if "num_zeros" in v:
    line += f" num zeros: {float(v['num_zeros'])} |"
if "params_norm" in v:
    line += f" params norm: {v['params_norm']:.3f} |"
line += " number of skipped iterations: {:3d} |".format(v["skipped"])
line += " number of nan iterations: {:3d} |".format(v["nan"])
print(line)
