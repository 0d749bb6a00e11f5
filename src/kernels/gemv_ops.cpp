#include "kernels/gemv_ops.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda_dispatch.h"
#include "kernels/ops.h"

namespace megatron::kernels {

namespace {
constexpr int64_t kGemvLongestReduction = 8192;
}  // namespace

bool gemv_takes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!uses_kernel(x) || x.scalar_type() == at::kFloat || x.dim() < 1 || !x.is_contiguous()) return false;
  if (weight.dim() != 2 || x.numel() != weight.size(1) || x.size(-1) != weight.size(1)) return false;
  if (weight.scalar_type() != x.scalar_type() || weight.device() != x.device() || weight.stride(1) != 1) return false;
  if (weight.size(1) % 8 != 0 || weight.stride(0) % 8 != 0) return false;
  // Past this reduction length cuBLAS streams faster (Llama 3 8B's fc2, k = 14336: 1.15x slower
  // here; every k up to 5632 measured 0.90-0.97x of cuBLAS but the 1.1B fc1's 1.08x).
  if (weight.size(1) > kGemvLongestReduction) return false;
  if (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0 || reinterpret_cast<uintptr_t>(weight.data_ptr()) % 16 != 0) return false;
  if (bias.defined() && (bias.dim() != 1 || bias.numel() != weight.size(0) || !bias.is_contiguous() ||
                         bias.scalar_type() != x.scalar_type() || bias.device() != x.device())) {
    return false;
  }
  const bool wants_grad = x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad());
  return !(c10::GradMode::is_enabled() && wants_grad);
}

namespace {

// A pending RMSNorm for run_gemv: the input is rms_norm(x + add) * gamma, the sum written to sum.
struct PendingNorm {
  at::Tensor add, gamma, sum;
  double eps = 0.0;
};

// y [..., n] (n: the weight's rows, half of them when gated) from the kernel.
at::Tensor run_gemv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, bool gated, const PendingNorm* norm = nullptr) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = gated ? weight.size(0) / 2 : weight.size(0);
  at::Tensor y = at::empty(shape, x.options());  // [..., n]
#ifdef MEGATRON_WITH_CUDA_KERNELS
  cuda::GemvArgs a{};
  if (norm != nullptr) {
    a.add = norm->add.defined() ? norm->add.data_ptr() : nullptr;
    a.norm_weight = norm->gamma.data_ptr();
    a.sum_out = norm->sum.defined() ? norm->sum.data_ptr() : nullptr;
    a.norm_eps = static_cast<float>(norm->eps);
  }
  a.x = x.data_ptr();
  a.w = weight.data_ptr();
  a.bias = bias.defined() ? bias.data_ptr() : nullptr;
  a.y = y.data_ptr();
  a.dtype = storage_type(x);
  a.n = shape.back(), a.k = weight.size(1), a.w_stride = weight.stride(0);
  a.gated = gated;
  cuda::gemv(a, current_stream());
#else
  (void)bias, (void)norm;
#endif
  return y;
}

}  // namespace

at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  TORCH_CHECK(gemv_takes(x, weight, bias), "gemv: x ", x.sizes(), " and weight ", weight.sizes(),
              " are not one row and a weight of a kind the kernel takes (gemv_takes)");
  return run_gemv(x, weight, bias, /*gated=*/false);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return gemv_takes(x, weight, bias) ? gemv(x, weight, bias) : at::linear(x, weight, bias);
}

at::Tensor linear_swiglu(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) % 2 == 0, "linear_swiglu: the weight ", weight.sizes(),
              " is not [2f, k] ([gate; up] rows)");
  if (gemv_takes(x, weight, {})) return run_gemv(x, weight, {}, /*gated=*/true);
  return swiglu(at::linear(x, weight));
}

bool gemv_after_norm_takes(const at::Tensor& base, const at::Tensor& add, const at::Tensor& gamma, const at::Tensor& weight,
                           const at::Tensor& bias, bool gated) {
  if (gated && bias.defined()) return false;
  // gemv_takes bounds k by kGemvLongestReduction, which is the kernel's kGemvLongestNormed too.
  if (!gemv_takes(base, weight, bias)) return false;
  auto fits = [&](const at::Tensor& t, int64_t numel) {
    return t.scalar_type() == base.scalar_type() && t.device() == base.device() && t.is_contiguous() && t.numel() == numel &&
           reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && !(c10::GradMode::is_enabled() && t.requires_grad());
  };
  return fits(gamma, base.size(-1)) && (!add.defined() || (add.sizes() == base.sizes() && fits(add, base.numel())));
}

NormedLinear gemv_after_norm(const at::Tensor& base, const at::Tensor& add, const at::Tensor& gamma, double eps, const at::Tensor& weight,
                             const at::Tensor& bias, bool gated) {
  TORCH_CHECK(!gated || weight.size(0) % 2 == 0, "gemv_after_norm: the gated weight ", weight.sizes(), " is not [2f, k]");
  TORCH_CHECK(gemv_after_norm_takes(base, add, gamma, weight, bias, gated), "gemv_after_norm: base ", base.sizes(), ", weight ",
              weight.sizes(), " and gamma ", gamma.sizes(), " are not of a kind the kernel takes (gemv_after_norm_takes)");
  PendingNorm norm{add, gamma, add.defined() ? at::empty_like(base) : at::Tensor(), eps};
  at::Tensor y = run_gemv(base, weight, bias, gated, &norm);
  return {add.defined() ? norm.sum : base, y};
}

}  // namespace megatron::kernels
