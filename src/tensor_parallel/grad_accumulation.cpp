#include "tensor_parallel/grad_accumulation.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "kernels/gemv_ops.h"
#include "kernels/grouped_wgrad_ops.h"
#include "kernels/ops.h"

namespace megatron::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Keyed by the weight's TensorImpl, which stays the same when the gradient buffer moves the
// weight's storage into its flat buffer. Pipeline tests run stages on threads: hence the lock.
std::mutex registry_mutex;
std::unordered_map<const c10::TensorImpl*, MainGradTarget> registry;

const MainGradTarget* find_target(const at::Tensor& weight) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry.find(weight.unsafeGetTensorImpl());
  return it == registry.end() ? nullptr : &it->second;
}

struct LinearAccumulatingWeightGrad : torch::autograd::Function<LinearAccumulatingWeightGrad> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    ctx->save_for_backward({x});
    // The parameter itself, not a saved variable: its registration is keyed by this TensorImpl,
    // which a saved variable with hooks (--cpu-offloading) would hand back as a copy.
    ctx->saved_data["weight"] = weight;
    return at::linear(x, weight);  // [..., out]
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];       // [..., in]
    const at::Tensor weight = ctx->saved_data["weight"].toTensor();  // [out, in]
    at::Tensor dy = grads[0];             // [..., out]
    at::Tensor dx = at::matmul(dy, weight);
    at::Tensor dy2 = dy.reshape({-1, dy.size(-1)}), x2 = x.reshape({-1, x.size(-1)});
    const MainGradTarget* target = find_target(weight);
    TORCH_CHECK(target != nullptr, "gradient-accumulation fusion: the weight lost its main_grad registration");
    at::Tensor main_grad = target->main_grad;  // [out, in] fp32 (bf16 with --grad-reduce-in-bf16), the buffer's storage
    {
      at::NoGradGuard no_grad;
      // += dy^T x, or = dy^T x for the step's first gradient (beta 0: the old contents, not
      // zeroed, are not read).
      const double beta = target->first_add() ? 0.0 : 1.0;
      if (main_grad.scalar_type() == dy2.scalar_type()) {
        main_grad.addmm_(dy2.t(), x2, beta);
      } else if (main_grad.is_cuda()) {
        at::addmm_out(main_grad, main_grad, dy2.t(), x2, main_grad.scalar_type(), beta);  // bf16 in, fp32 accumulate
      } else if (beta == 0.0) {
        main_grad.copy_(at::mm(dy2.t(), x2));
      } else {
        main_grad.add_(at::mm(dy2.t(), x2));
      }
    }
    target->on_added();
    return {dx, at::Tensor()};
  }
};

}  // namespace

const MainGradTarget* main_grad_target(const at::Tensor& weight) { return find_target(weight); }

void register_main_grad(const at::Tensor& weight, MainGradTarget target) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry[weight.unsafeGetTensorImpl()] = std::move(target);
}

void unregister_main_grad(const at::Tensor& weight) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry.erase(weight.unsafeGetTensorImpl());
}

at::Tensor stacked_in_place(at::TensorList tensors) {
  if (tensors.empty()) return {};
  const at::Tensor& first = tensors[0];
  const int64_t step = first.numel();
  for (size_t e = 0; e < tensors.size(); ++e) {
    const at::Tensor& t = tensors[e];
    const bool adjacent = t.is_contiguous() && t.sizes().equals(first.sizes()) && t.scalar_type() == first.scalar_type() &&
                          t.storage().is_alias_of(first.storage()) &&
                          t.storage_offset() == first.storage_offset() + int64_t(e) * step;
    if (!adjacent) return {};
  }
  std::vector<int64_t> sizes = {int64_t(tensors.size())}, strides = {step};
  for (int64_t d = 0; d < first.dim(); ++d) {
    sizes.push_back(first.size(d));
    strides.push_back(first.stride(d));
  }
  return first.as_strided(sizes, strides, first.storage_offset());
}

at::Tensor stacked(at::TensorList tensors) {
  at::Tensor in_place = stacked_in_place(tensors);
  return in_place.defined() ? in_place : at::stack(tensors);
}

namespace {

// The registrations of `weights` and their main_grads as one [n, out, in] view; no targets where
// a weight has none or the main_grads do not lie side by side.
struct StackedTargets {
  std::vector<const MainGradTarget*> targets;
  at::Tensor main_grads;  // [n, out, in]
};

StackedTargets find_stacked_targets(at::TensorList weights) {
  StackedTargets found;
  std::vector<at::Tensor> main_grads;
  for (const at::Tensor& w : weights) {
    const MainGradTarget* target = find_target(w);
    if (target == nullptr) return {};
    found.targets.push_back(target);
    main_grads.push_back(target->main_grad);
  }
  found.main_grads = stacked_in_place(main_grads);
  if (!found.main_grads.defined()) found.targets.clear();
  return found;
}

// Whether each target's main_grad takes its step's first gradient (first_add(), asked once each).
std::vector<bool> take_first_adds(const std::vector<const MainGradTarget*>& targets) {
  std::vector<bool> first(targets.size());
  for (size_t e = 0; e < targets.size(); ++e) first[e] = targets[e]->first_add();
  return first;
}

bool all_equal(const std::vector<bool>& flags) {
  return std::all_of(flags.begin(), flags.end(), [&](bool f) { return f == flags.front(); });
}

// dw [n, out, in] into the stacked main_grads, overwriting those whose flag says first.
void add_stacked(const at::Tensor& main_grads, const at::Tensor& dw, const std::vector<bool>& first) {
  if (all_equal(first)) {
    kernels::accumulate_grad(main_grads, dw, /*overwrite=*/first.front());  // one pass over the layer
  } else {
    for (size_t e = 0; e < first.size(); ++e) kernels::accumulate_grad(main_grads[int64_t(e)], dw[int64_t(e)], first[e]);
  }
}

}  // namespace

bool add_to_stacked_main_grads(at::TensorList weights, const at::Tensor& dw) {
  const StackedTargets found = find_stacked_targets(weights);
  if (found.targets.empty()) return false;
  TORCH_CHECK(found.main_grads.sizes() == dw.sizes(), "stacked weight gradient ", dw.sizes(), " for main_grads ",
              found.main_grads.sizes());
  add_stacked(found.main_grads, dw, take_first_adds(found.targets));
  for (const MainGradTarget* target : found.targets) target->on_added();
  return true;
}

bool add_grouped_weight_grads_to_main_grads(at::TensorList weights, const at::Tensor& dy, const at::Tensor& x,
                                            const at::Tensor& ends) {
  if (!kernels::built_with_grouped_wgrad() || !dy.is_cuda()) return false;
  const StackedTargets found = find_stacked_targets(weights);
  if (found.targets.empty() || !kernels::grouped_weight_grad_supported(found.main_grads, dy, x, ends)) return false;
  const std::vector<bool> first = take_first_adds(found.targets);
  if (all_equal(first)) {
    kernels::grouped_weight_grad_into(found.main_grads, dy, x, ends, /*accumulate=*/!first.front());
  } else {
    // Some experts' main_grads hold this step's gradient and others not (never within one
    // layer's grouped GEMM, which reaches all its experts every micro-batch): per expert.
    add_stacked(found.main_grads, at::_grouped_mm(dy.t(), x, ends), first);
  }
  for (const MainGradTarget* target : found.targets) target->on_added();
  return true;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!weight.requires_grad() || !at::GradMode::is_enabled() || find_target(weight) == nullptr) {
    return kernels::linear(x, weight, bias);  // one row and no gradient (a batch-1 decode step): the GEMV
  }
  // The bias stays outside the function: autograd functions cannot take an undefined tensor.
  at::Tensor y = LinearAccumulatingWeightGrad::apply(x, weight);
  return bias.defined() ? y + bias : y;
}

}  // namespace megatron::tp
