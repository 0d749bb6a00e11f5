#include "tensor_parallel/grad_accumulation.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <unordered_map>

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
    ctx->save_for_backward({x, weight});
    return at::linear(x, weight);  // [..., out]
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];       // [..., in]
    const at::Tensor& weight = saved[1];  // [out, in]
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

void register_main_grad(const at::Tensor& weight, MainGradTarget target) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry[weight.unsafeGetTensorImpl()] = std::move(target);
}

void unregister_main_grad(const at::Tensor& weight) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry.erase(weight.unsafeGetTensorImpl());
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!weight.requires_grad() || !at::GradMode::is_enabled() || find_target(weight) == nullptr) {
    return at::linear(x, weight, bias);
  }
  // The bias stays outside the function: autograd functions cannot take an undefined tensor.
  at::Tensor y = LinearAccumulatingWeightGrad::apply(x, weight);
  return bias.defined() ? y + bias : y;
}

}  // namespace megatron::tp
