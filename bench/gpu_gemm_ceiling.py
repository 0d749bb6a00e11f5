"""What cuBLAS does with the GEMMs of one training step of the reference shape, run on their own.

The 1.1B reference shape (hidden 2048, ffn 5632, 4 query groups of 64-wide heads, vocab 32000,
8192 tokens per micro-batch) has five linear layers: QKV, attention output, fc1 (gate and up),
fc2, and the output layer. Each runs three GEMMs per step: forward (Y = X W^T), input gradient
(dX = dY W) and weight gradient (dW = dY^T X, accumulated in fp32 as megatron.cpp does). This
times each one alone (CUDA events, after warm-up) and then the whole step's set back to back,
as a training step issues them, and prints TFLOP/s per GEMM and the step total: the time the
step's GEMMs cannot go below with cuBLAS on this GPU, to hold against the profile's GEMM time.
  python3 bench/gpu_gemm_ceiling.py [--tokens 8192] [--reps 20] [--blas cublas|cublaslt]
"""
import argparse

import torch

p = argparse.ArgumentParser()
p.add_argument("--tokens", type=int, default=8192)
p.add_argument("--reps", type=int, default=20)
p.add_argument("--blas", choices=["cublas", "cublaslt"], help="torch's preferred BLAS library (default: torch's choice)")
a = p.parse_args()
if a.blas:
    torch.backends.cuda.preferred_blas_library(a.blas)
t = a.tokens
hidden, ffn, layers, vocab, groups, head = 2048, 5632, 22, 32000, 4, 64
linears = {  # name: (input features, output features, how many per step)
    "qkv": (hidden, hidden + 2 * groups * head, layers),
    "proj": (hidden, hidden, layers),
    "fc1": (hidden, 2 * ffn, layers),
    "fc2": (ffn, hidden, layers),
    "output": (hidden, vocab, 1),
}
bf16 = dict(device="cuda", dtype=torch.bfloat16)


def gemms(k, n):
    """The three GEMMs of a linear layer with k inputs and n outputs, as closures."""
    x, w, dy = torch.randn(t, k, **bf16), torch.randn(n, k, **bf16), torch.randn(t, n, **bf16)
    return {
        "forward": lambda: x @ w.t(),
        "dgrad": lambda: dy @ w,
        # fp32 output from bf16 inputs, as the fused weight-gradient GEMM writes main_grad.
        "wgrad": lambda: torch.mm(dy.t(), x, out_dtype=torch.float32),
        "_state": (x, w, dy),
    }


def timed(fn, reps):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps  # ms


print(f"GEMMs of the reference step ({t} tokens), {torch.backends.cuda.preferred_blas_library()} via torch "
      f"{torch.__version__} on {torch.cuda.get_device_name()}")
print(f"{'linear':8} {'GEMM':8} {'M x N x K':>22} {'ms':>8} {'TFLOP/s':>8} {'per step':>9}")
step_fns, step_ms, step_flops = [], 0.0, 0.0
for name, (k, n, count) in linears.items():
    g = gemms(k, n)
    try:
        g["wgrad"]()
    except TypeError:  # a torch without out_dtype: bf16 output
        x, w, dy = g["_state"]
        g["wgrad"] = lambda dy=dy, x=x: dy.t() @ x
    shapes = {"forward": (t, n, k), "dgrad": (t, k, n), "wgrad": (n, k, t)}
    for kind in ("forward", "dgrad", "wgrad"):
        ms = timed(g[kind], a.reps)
        m_, n_, k_ = shapes[kind]
        flops = 2.0 * m_ * n_ * k_
        print(f"{name:8} {kind:8} {m_:>6} x {n_:>5} x {k_:>5} {ms:8.3f} {flops / ms / 1e9:8.1f} {ms * count:9.2f}")
        step_ms += ms * count
        step_flops += flops * count
        step_fns += [g[kind]] * count
print(f"sum of the GEMMs timed one by one: {step_ms:.2f} ms per step ({step_flops / step_ms / 1e9:.1f} TFLOP/s)")
back_to_back = timed(lambda: [f() for f in step_fns], max(3, a.reps // 4))
print(f"the step's GEMMs back to back: {back_to_back:.2f} ms per step ({step_flops / back_to_back / 1e9:.1f} TFLOP/s)")
big = torch.randn(8192, 8192, **bf16)
ms = timed(lambda: big @ big, a.reps)
print(f"8192^3 bf16 GEMM: {2 * 8192**3 / ms / 1e9:.1f} TFLOP/s")
