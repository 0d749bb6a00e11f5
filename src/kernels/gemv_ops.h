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

// The RMSNorm in front of a linear layer computed in the GEMV (a batch-1 decode step's
// input norm before QKV and pre-MLP norm before fc1): sum = base + add (rounded; base itself when
// add is undefined), y = the layer (gated: SwiGLU's fc1, as linear_swiglu) applied to
// rms_norm(sum) * gamma. What add_rms_norm then linear / linear_swiglu compute, but for the order
// of the norm's sum of squares and its output not rounded on the way (the kernel scales the dot
// products of sum * gamma by 1 / rms).
// A pending RMSNorm in front of a GEMV: its input is rms_norm(x + add) * gamma (add undefined:
// rms_norm(x) * gamma).
struct InputNorm {
  at::Tensor add, gamma;
  double eps = 0.0;
};

// The residual sum with its next RMSNorm half done by the GEMV that produced it: what a batch-1
// decode step's attention output projection and fc2 hand on (gemv_into_norm), so that the next
// GEMV finishes the norm reading one row, as a plain GEMV does (gemv_after_prepared_norm, or the
// PreparedNorm overload of gemv_rope_into_cache): no norm launch, and no pass of the next GEMV's
// blocks over the sum and the norm's weight either.
struct PreparedNorm {
  at::Tensor sum;      // [..., k]: residual + the layer's output, each rounded (add_rms_norm's sum)
  at::Tensor scaled;   // [..., k]: sum * gamma, rounded: the next GEMV's input
  at::Tensor squares;  // [k / 4] fp32: the producing blocks' sums of sum's squares
  double eps = 0.0;
};
// gemv_takes(x, weight, {}); residual [..., n] and gamma [n] of x's dtype and device, contiguous,
// 16-byte aligned; n a multiple of cuda::kGemvRows (4: each block its rows' squares).
bool gemv_into_norm_takes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& residual, const at::Tensor& gamma);
// sum = residual + linear(x, weight) (both rounded), and the RMSNorm (gamma, eps) after it prepared.
PreparedNorm gemv_into_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& residual, const at::Tensor& gamma, double eps);
// gemv_takes(p.scaled, weight, bias) (no bias when gated), p.squares fp32 contiguous on its device.
bool gemv_after_prepared_norm_takes(const PreparedNorm& p, const at::Tensor& weight, const at::Tensor& bias, bool gated);
// The layer (gated: SwiGLU's fc1, as linear_swiglu) applied to rms_norm(p.sum) * gamma: the dot
// products of p.scaled scaled by 1 / rms, as gemv_after_norm computes them.
at::Tensor gemv_after_prepared_norm(const PreparedNorm& p, const at::Tensor& weight, const at::Tensor& bias, bool gated);

struct NormedLinear {
  at::Tensor sum;  // [..., k]
  at::Tensor y;    // [..., n]
};
// gemv_takes(base, weight, bias) (no bias when gated), and add (if defined) and gamma [k] of base's
// dtype and device, contiguous, 16-byte aligned; k at most 8192.
bool gemv_after_norm_takes(const at::Tensor& base, const at::Tensor& add, const at::Tensor& gamma, const at::Tensor& weight,
                           const at::Tensor& bias, bool gated);
NormedLinear gemv_after_norm(const at::Tensor& base, const at::Tensor& add, const at::Tensor& gamma, double eps, const at::Tensor& weight,
                             const at::Tensor& bias, bool gated);

// A batch-1 decode step's QKV layer with RoPE into the key/value cache in its epilogue (and the
// input norm in it where `norm` is given): what linear (or gemv_after_norm) and then
// qkv_rope_into_cache compute, in one launch. x [1, 1, k] (with a norm: the residual base);
// weight [G (P + 2) d, k] ([P queries, key, value] a group); bias [G (P + 2) d] or undefined.
struct QkvIntoCache {
  int64_t heads_per_group = 0;  // P
  at::Tensor cos, sin;          // fp32 [..., d]: this token's RoPE tables first
  at::Tensor k_store, v_store;  // [rows, G, d] in x's dtype
  at::Tensor store_rows;        // [1] int64: the row this token's key and value go to
};
bool gemv_rope_into_cache_takes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const QkvIntoCache& into,
                                const InputNorm* norm);
// -> the rotated queries [1, 1, G P, d]; with a norm, *sum (where non-null) = the residual sum.
at::Tensor gemv_rope_into_cache(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const QkvIntoCache& into,
                                const InputNorm* norm, at::Tensor* sum);
// The same with the input norm prepared by the GEMV before (gemv_into_norm): the GEMV reads
// p.scaled and finishes the norm as gemv_after_prepared_norm does; p.sum is the residual sum.
bool gemv_rope_into_cache_takes(const PreparedNorm& p, const at::Tensor& weight, const at::Tensor& bias, const QkvIntoCache& into);
at::Tensor gemv_rope_into_cache(const PreparedNorm& p, const at::Tensor& weight, const at::Tensor& bias, const QkvIntoCache& into);

}  // namespace megatron::kernels
