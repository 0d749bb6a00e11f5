// One of the experts' two linear layers (fc1 or fc2 of every local expert) as FP8 grouped GEMMs
// (--fp8-format on an MoE layer; fp8/grouped.h says which scaling and why):
//   forward   y  = x W_e^T    rows of x and of W cast row-wise, fast accumulation (as Transformer
//                             Engine's forward GEMM)
//   backward  dx = dy W_e     rows of dy and of W^T cast row-wise
//             dW_e = dy_e^T x_e  both operands' columns cast per expert, the expert's rows padded
//                             to 16; the experts' blocks added into their main_grads in one pass
// Only the FP8 copy of x that the weight gradient reads is kept for backward (half of bf16's
// bytes); the weights are cast once per step (both layouts), reused by every micro-batch.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "fp8/quantize.h"
#include "fp8/recipe.h"

namespace megatron::moe {

class Fp8GroupedLinear {
 public:
  // `name` says which layer in errors (e.g. "layer 3 experts' linear_fc1").
  Fp8GroupedLinear(std::shared_ptr<fp8::Fp8Context> context, std::string name);
  // rows [N, in] grouped by expert (counts [E] int64 and their cumulative ends [E] int32, on the
  // rows' device), weights: E x [out, in] -> [N, out] in the rows' dtype.
  at::Tensor forward(const at::Tensor& rows, const at::Tensor& counts, const at::Tensor& ends, at::TensorList weights);

  // The experts' weights cast for the current step: rows of W [E, out, in] for the forward, rows
  // of W^T [E, in, out] for the data gradient.
  struct WeightCast {
    int64_t step = -1;
    fp8::Quantized rowwise, transposed;
  };
  const WeightCast& weight_cast(at::TensorList weights);

 private:
  void check_shapes(int64_t in, int64_t out) const;
  std::shared_ptr<fp8::Fp8Context> context_;
  std::string name_;
  WeightCast weight_;
};

}  // namespace megatron::moe
