// The one-row linear layer (src/kernels/gemv.cu) as LibTorch sees it: a batch-1 decode step's
// projections, where cuBLAS's M = 1 tiles leave bandwidth unused. No autograd: callers take it only
// where no gradient is wanted (gemv_takes says so).
#pragma once

#include <ATen/core/Tensor.h>

namespace megatron::kernels {

// Whether gemv() runs for these: a CUDA build; x bf16 / fp16 on a CUDA device holding one row
// ([..., k] with every leading dim 1, contiguous); weight [n, k] of x's dtype with contiguous rows,
// k and the row stride multiples of 8, k at most 8192 (longer ones stream faster through cuBLAS); bias undefined or [n] contiguous of x's dtype; and no
// gradient wanted (grad mode off, or none of them requires one).
bool gemv_takes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
// y [..., n] = x W^T (+ bias), fp32 accumulation, rounded once.
at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
// at::linear(x, weight, bias), through gemv() where it takes them (a batch-1 decode step's layers).
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
// swiglu(at::linear(x, weight)) for SwiGLU's fc1 weight [2f, k] ([gate; up] rows), no bias:
// [..., f]. Where gemv_takes(x, weight, {}) one GEMV computes it with the activation in its
// epilogue (the fc1 output rounded as the unfused one is, so the two agree to the last bit but
// for the order of the sums); otherwise the linear layer and kernels::swiglu.
at::Tensor linear_swiglu(const at::Tensor& x, const at::Tensor& weight);

}  // namespace megatron::kernels
