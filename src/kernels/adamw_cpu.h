// The fused AdamW step on the CPU: the CUDA kernel's arithmetic (kernels/adamw.cu), element by
// element in one pass over gradient, master and moments, over the host's threads. It steps the
// CPU training path and the offloaded optimizer (--optimizer-cpu-offload), where a step over
// billions of parameters must not make the passes and int64 temporaries of composing ATen ops.
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/ops.h"

namespace megatron::kernels {

// As adamw_step (kernels/ops.h) for CPU tensors: master fp32 or int16 remainders of the bf16
// `model`; moments fp32 or bf16; gradient fp32 or bf16; `model` a separate bf16/fp16/fp32 copy to
// write, or undefined when the master is the model's own fp32 tensor. Scalars on the CPU.
void adamw_step_cpu(const at::Tensor& master, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, const at::Tensor& grad,
                    const at::Tensor& model, const AdamWHyperparameters& h, const AdamWStepScalars& s);

}  // namespace megatron::kernels
