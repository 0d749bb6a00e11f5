"""SDPA backends on the reference attention shape, forward + backward, on the GPU machine.

The 1.1B reference shape's attention: micro-batch 4, 32 query heads in 4 groups, seq 2048,
head dim 64, causal, bf16. For each backend PyTorch offers here, times forward + backward with
q / k / v laid out as megatron.cpp passes them (permuted views of [s, b, heads, d]) and
contiguous [b, heads, s, d], so a layout that makes the backend copy shows up.

  python3 bench/gpu_attention_backends.py [--iters 20]
Prints one line per backend and layout: ms per forward + backward and achieved TFLOP/s
(causal: 2 * 2 * b * H * s^2 * d / 2 forward, 2.5x that backward).
"""
import argparse
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=20)
a = p.parse_args()
b, heads, groups, s, d = 4, 32, 4, 2048, 64
dev = torch.device("cuda")


def inputs(layout):
    if layout == "megatron":  # [s, b, n, d] storage, viewed as [b, n, s, d]
        q = torch.randn(s, b, heads, d, device=dev, dtype=torch.bfloat16).permute(1, 2, 0, 3)
        k = torch.randn(s, b, groups, d, device=dev, dtype=torch.bfloat16).permute(1, 2, 0, 3)
        v = torch.randn(s, b, groups, d, device=dev, dtype=torch.bfloat16).permute(1, 2, 0, 3)
    else:
        q = torch.randn(b, heads, s, d, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, groups, s, d, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, groups, s, d, device=dev, dtype=torch.bfloat16)
    return [t.detach().requires_grad_(True) for t in (q, k, v)]


flops = 2 * 2 * b * heads * s * s * d / 2 * 3.5  # causal forward + 2.5x for backward
for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
    for layout in ("megatron", "contiguous"):
        q, k, v = inputs(layout)
        grad = torch.randn(b, heads, s, d, device=dev, dtype=torch.bfloat16)
        try:
            with sdpa_kernel(backend):
                def step():
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    out.backward(grad)
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(a.iters):
                    step()
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end) / a.iters
            print(f"{backend.name:20s} {layout:10s} {ms:7.3f} ms fwd+bwd  {flops / ms / 1e9:6.1f} TFLOP/s  "
                  f"(x22 layers: {22 * ms:5.1f} ms)")
        except RuntimeError as e:
            print(f"{backend.name:20s} {layout:10s} not available: {str(e).splitlines()[0][:100]}")
