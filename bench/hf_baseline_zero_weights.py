"""The HF baseline with all-zero weights: the power-limit check's other side.

Runs the baseline script given as the first argument unchanged, except that every matrix of the
Llama model it builds (embedding, projections, output layer) is zeroed right after construction;
the norm weights stay 1. The kernels, shapes and bytes are the baseline's; only the operands toggle
no bits. `scripts/gpu/run.sh zero-weights` runs it next to megatron.cpp's --init-method-std 0.
  python3 bench/hf_baseline_zero_weights.py HF_BASELINE_SCRIPT [its flags]
"""
import runpy
import sys

import torch
import transformers

_init = transformers.LlamaForCausalLM.__init__


def _zeroed_init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    with torch.no_grad():
        for p in self.parameters():
            if p.dim() >= 2:
                p.zero_()


transformers.LlamaForCausalLM.__init__ = _zeroed_init
if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
