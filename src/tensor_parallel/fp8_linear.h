// A linear layer's GEMMs in FP8 (--fp8-format; recipes in fp8/recipe.h), as Transformer Engine's
// Linear runs them under fp8_autocast:
//   forward   y  = x W^T     x and W cast to e4m3
//   backward  dx = dy W      dy cast to the backward format (e5m2 under hybrid)
//             dW = dy^T x    from the transposed FP8 copies of dy and x (high-precision x with
//                            --no-fp8-wgrad), added into the weight's main_grad where the gradient
//                            buffer registered one (tensor_parallel/grad_accumulation.h)
// The layer keeps only the FP8 copy of x that the weight gradient reads (half of bf16's bytes),
// and casts W once per step (both layouts), reused by every micro-batch and recomputation.
// Outputs are in x's dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <memory>
#include <string>

#include "fp8/quantize.h"
#include "fp8/recipe.h"

namespace megatron::tp {

class Fp8Linear {
 public:
  // `name` says which layer in errors (linear_qkv, linear_fc2, ...).
  Fp8Linear(std::shared_ptr<fp8::Fp8Context> context, std::string name);
  // x [..., in], weight [out, in] -> [..., out]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& weight);

  fp8::Fp8Context& context() { return *context_; }
  // The delayed recipe's columns of this layer: input, weight, output gradient (-1 otherwise).
  const std::array<int, 3>& columns() const { return columns_; }

  // The weight cast for the current step: row-wise [out, in] for the forward, transposed
  // [in, out] for the data gradient.
  struct WeightCast {
    int64_t step = -1;
    fp8::Quantized rowwise, transposed;
  };
  const WeightCast& weight_cast(const at::Tensor& weight);
  // x [rows, cols] cast as this layer's recipe casts its input (column 0) or output gradient
  // (column 2): row-wise and/or the transposed copy.
  fp8::Cast cast_activation(const at::Tensor& x, int role, bool rowwise, bool transposed);

 private:
  // The tensorwise and delayed recipes' cast of t in `role` (column 0, 1 or 2).
  fp8::Cast cast_with_tensor_scale(const at::Tensor& t, int role, bool rowwise, bool transposed);
  void check_shapes(int64_t tokens, int64_t in, int64_t out, const at::Device& device) const;
  std::shared_ptr<fp8::Fp8Context> context_;
  std::string name_;
  std::array<int, 3> columns_ = {-1, -1, -1};
  WeightCast weight_;
};

}  // namespace megatron::tp
