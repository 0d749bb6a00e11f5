// Gradient-accumulation fusion (Megatron's default; --no-gradient-accumulation-fusion turns it
// off): the weight-gradient GEMM of a linear layer adds its product straight into the
// parameter's fp32 main_grad (cuBLAS accumulating in fp32 over bf16 inputs), instead of writing a
// bf16 .grad that a hook then upcasts and adds, one extra pass over every weight per micro-batch.
//
// The gradient buffer (optim/grad_buffer.cpp) registers, per parameter, its main_grad and what
// its post-accumulate hook would have done next (bucket bookkeeping); a layer whose weight has a
// registration runs the fused linear, any other weight the plain one. Each registered weight
// must feed one linear per micro-batch (its gradient arrives through this path only).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace megatron::tp {

struct MainGradTarget {
  at::Tensor main_grad;               // fp32, the weight's shape
  // Called before each add: true when main_grad holds no gradient of this step yet, so the GEMM
  // overwrites it (beta = 0) instead of adding to a zero-filled buffer.
  std::function<bool()> first_add;
  std::function<void()> on_added;     // called after each micro-batch's gradient is added
};

void register_main_grad(const at::Tensor& weight, MainGradTarget target);
void unregister_main_grad(const at::Tensor& weight);

// Same-shaped contiguous tensors that lie one after another in one storage (an MoE layer's
// experts, as the gradient buffer lays them out) as one [n, ...] view of that storage, without a
// copy; undefined when they do not.
at::Tensor stacked_in_place(at::TensorList tensors);
// The same tensors as one [n, ...] tensor: that view where they lie side by side, else a copy.
at::Tensor stacked(at::TensorList tensors);

// The weight gradients of several registered weights at once, dw [n, out, in] with dw[e] for
// weights[e] (an MoE layer's experts from one grouped GEMM): added into their main_grads in one
// pass over the stacked main_grads (one upcast of the layer instead of n hook calls). Returns
// false and does nothing when a weight has no registration or their main_grads do not lie side
// by side: the caller then hands autograd the gradients one by one.
bool add_to_stacked_main_grads(at::TensorList weights, const at::Tensor& dw);

// The weight gradients of a grouped linear (an MoE layer's experts, weights[g] for the rows
// [ends[g-1], ends[g]) of dy [rows, out] and x [rows, in]) straight into their main_grads by the
// grouped GEMM's epilogue (kernels::grouped_weight_grad_into: no bf16 gradient written and added
// back). Returns false and does nothing where that kernel does not run or a main_grad is missing
// or not side by side: the caller then forms the gradients and hands them to
// add_to_stacked_main_grads.
bool add_grouped_weight_grads_to_main_grads(at::TensorList weights, const at::Tensor& dy, const at::Tensor& x,
                                            const at::Tensor& ends);

// The registration of `weight`, or null: a layer computing its own weight gradient (the FP8
// linear) writes it into main_grad (overwriting when first_add() says so) and calls on_added().
const MainGradTarget* main_grad_target(const at::Tensor& weight);

// y = x W^T (+ bias). With a registered weight, backward adds dW into its main_grad and leaves
// weight.grad undefined; the bias gradient and dx take the ordinary path.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias = {});

}  // namespace megatron::tp
