// The LibTorch side of the grouped weight-gradient GEMM that adds into main_grad
// (src/kernels/grouped_wgrad.h): an MoE layer's experts' weight gradients straight into their
// main_grads, in the GEMM's epilogue.
#pragma once

#include <ATen/core/Tensor.h>

namespace megatron::kernels {

// Whether this build has the kernel (CUDA, with CUTLASS's headers: MEGATRON_WITH_CUTLASS).
bool built_with_grouped_wgrad();

// Whether grouped_weight_grad_into runs on these tensors: this build has the kernel, the GPU is an
// sm_90 one, the dtypes and shapes below, 16-byte-aligned rows. Where not, the caller takes the
// unfused path (ATen's grouped GEMM, then an add).
bool grouped_weight_grad_supported(const at::Tensor& main_grads, const at::Tensor& dy, const at::Tensor& x,
                                   const at::Tensor& ends);

// main_grads[g] (+)= dy_g^T x_g for the rows [ends[g-1], ends[g]) of dy [rows, out] and x
// [rows, in] (bf16, contiguous; ends int32 [groups] on the device): added when `accumulate`, else
// written over (groups without rows then get zeros). main_grads [groups, out, in], fp32 or bf16,
// contiguous.
void grouped_weight_grad_into(const at::Tensor& main_grads, const at::Tensor& dy, const at::Tensor& x,
                              const at::Tensor& ends, bool accumulate);

}  // namespace megatron::kernels
