// What the LibTorch side of the fused kernels (ops.cpp, moe_ops.cpp) shares in CUDA builds: a
// tensor's storage type as the kernels name it, and the stream they launch on.
#pragma once

#ifdef MEGATRON_WITH_CUDA_KERNELS
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>

#include "kernels/kernels.h"

namespace megatron::kernels {

inline cuda::DType storage_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return cuda::DType::Float32;
    case at::kBFloat16: return cuda::DType::BFloat16;
    case at::kHalf: return cuda::DType::Float16;
    default: TORCH_CHECK(false, "fused kernels take fp32, bf16 or fp16 tensors, not ", t.scalar_type());
  }
}

inline cuda::Stream current_stream() { return at::cuda::getCurrentCUDAStream().stream(); }

}  // namespace megatron::kernels
#endif
