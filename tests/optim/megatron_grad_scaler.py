"""Megatron-Core's DynamicGradScaler (megatron/core/optimizer/grad_scaler.py) driven through a
sequence of overflow flags, for tests/optim/test_grad_scaler.cpp to compare with megatron.cpp's.

  python megatron_grad_scaler.py INITIAL,MIN,WINDOW,HYSTERESIS,FLAGS ...
FLAGS: a string of 0/1, one per step (1: the step's gradients overflowed). For each case, prints
the scale and the two trackers after each update, one step per line (megatron-core is imported
once for all of them).
The class keeps its state on 'cuda'; here the tensors it makes are put on the CPU instead.
"""
import sys
import warnings

import torch

warnings.filterwarnings("ignore")  # megatron-core's notes that TransformerEngine and Apex are absent

_tensor = torch.tensor


def _on_cpu(*args, **kwargs):
    kwargs["device"] = "cpu"
    return _tensor(*args, **kwargs)


torch.tensor = _on_cpu
from megatron.core.optimizer.grad_scaler import DynamicGradScaler  # noqa: E402

for case in sys.argv[1:]:
    initial, minimum, window, hysteresis, flags = case.split(",")
    scaler = DynamicGradScaler(initial_scale=float(initial), min_scale=float(minimum), growth_factor=2.0,
                               backoff_factor=0.5, growth_interval=float(window), hysteresis=int(hysteresis))
    for flag in flags:
        scaler.update(flag == "1")
        state = scaler.state_dict()
        print(f"{float(state['scale']):.17g} {state['growth_tracker']} {state['hysteresis_tracker']}")
