#include "kernels/gemv_ops.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda_dispatch.h"
#include "kernels/kernels.h"  // kGemvRows (CPU builds too)
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

// What a GEMV does beyond y = x W^T (+ bias); at most one of norm and after_prepared.
struct GemvCall {
  bool gated = false;                        // SwiGLU's fc1: [gate; up] rows, the activation in the epilogue
  const InputNorm* norm = nullptr;           // the input is rms_norm(x (+ norm->add)) * gamma ...
  at::Tensor* sum = nullptr;                 // ... and *sum the residual sum: a new tensor, or x without add
  const PreparedNorm* after_prepared = nullptr;  // x is its scaled row; the norm finished here
  const QkvIntoCache* rope = nullptr;        // y: the rotated queries [..., H, d]; keys and values into the cache
  PreparedNorm* into_norm = nullptr;         // y: residual + x W^T, and the next norm prepared beside it
  const at::Tensor* residual = nullptr;      // with into_norm
  const at::Tensor* next_gamma = nullptr;    // with into_norm
};

// y [..., n] (n: the weight's rows, half of them when gated) from the kernel, as `call` says.
at::Tensor run_gemv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const GemvCall& call = {}) {
  const bool gated = call.gated;
  const InputNorm* norm = call.norm;
  if (norm != nullptr) *call.sum = norm->add.defined() ? at::empty_like(x) : x;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = gated ? weight.size(0) / 2 : weight.size(0);
  const QkvIntoCache* rope = call.rope;
  if (rope != nullptr) {  // the queries: [..., G P, d]
    const int64_t d = rope->k_store.size(2), groups = rope->k_store.size(1);
    shape.back() = groups * rope->heads_per_group;
    shape.push_back(d);
  }
  at::Tensor y = at::empty(shape, x.options());  // [..., n]
#ifdef MEGATRON_WITH_CUDA_KERNELS
  cuda::GemvArgs a{};
  if (const PreparedNorm* p = call.after_prepared) {
    a.norm_squares = p->squares.data_ptr<float>();
    a.norm_square_count = p->squares.numel();
    a.norm_eps = static_cast<float>(p->eps);
  } else if (norm != nullptr) {
    a.add = norm->add.defined() ? norm->add.data_ptr() : nullptr;
    a.norm_weight = norm->gamma.data_ptr();
    a.sum_out = norm->add.defined() ? call.sum->data_ptr() : nullptr;
    a.norm_eps = static_cast<float>(norm->eps);
  }
  if (rope != nullptr) {
    a.rope.q_out = y.data_ptr();
    a.rope.k_store = rope->k_store.data_ptr();
    a.rope.v_store = rope->v_store.data_ptr();
    a.rope.store_row = rope->store_rows.data_ptr<int64_t>();
    a.rope.cos = rope->cos.data_ptr<float>();
    a.rope.sin = rope->sin.data_ptr<float>();
    a.rope.head_dim = rope->k_store.size(2), a.rope.heads_per_group = rope->heads_per_group;
    a.rope.store_stride_row = rope->k_store.stride(0), a.rope.store_stride_group = rope->k_store.stride(1);
  }
  a.x = x.data_ptr();
  a.w = weight.data_ptr();
  a.bias = bias.defined() ? bias.data_ptr() : nullptr;
  a.y = y.data_ptr();
  a.dtype = storage_type(x);
  a.n = gated ? weight.size(0) / 2 : weight.size(0), a.k = weight.size(1), a.w_stride = weight.stride(0);
  a.gated = gated;
  if (PreparedNorm* into_norm = call.into_norm) {
    // y is the residual sum; the scaled row and the blocks' squares beside it.
    into_norm->sum = y;
    into_norm->scaled = at::empty_like(y);
    into_norm->squares = at::empty({(a.n + cuda::kGemvRows - 1) / cuda::kGemvRows}, x.options().dtype(at::kFloat));
    a.residual = call.residual->data_ptr();
    a.next_norm_weight = call.next_gamma->data_ptr();
    a.scaled_out = into_norm->scaled.data_ptr();
    a.squares_out = into_norm->squares.data_ptr<float>();
  }
  cuda::gemv(a, current_stream());
#else
  (void)bias, (void)norm;
  if (call.into_norm != nullptr) call.into_norm->sum = y;
#endif
  return y;
}

}  // namespace

at::Tensor gemv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  TORCH_CHECK(gemv_takes(x, weight, bias), "gemv: x ", x.sizes(), " and weight ", weight.sizes(),
              " are not one row and a weight of a kind the kernel takes (gemv_takes)");
  return run_gemv(x, weight, bias);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return gemv_takes(x, weight, bias) ? gemv(x, weight, bias) : at::linear(x, weight, bias);
}

at::Tensor linear_swiglu(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.size(0) % 2 == 0, "linear_swiglu: the weight ", weight.sizes(),
              " is not [2f, k] ([gate; up] rows)");
  if (gemv_takes(x, weight, {})) {
    GemvCall call;
    call.gated = true;
    return run_gemv(x, weight, {}, call);
  }
  return swiglu(at::linear(x, weight));
}

namespace {

// A vector the norm kernels read or write beside the GEMV's row x: x's dtype and device,
// contiguous, 16-byte aligned, no gradient wanted.
bool norm_vector_fits(const at::Tensor& t, const at::Tensor& x) {
  return t.scalar_type() == x.scalar_type() && t.device() == x.device() && t.is_contiguous() &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && !(c10::GradMode::is_enabled() && t.requires_grad());
}

}  // namespace

bool gemv_after_norm_takes(const at::Tensor& base, const at::Tensor& add, const at::Tensor& gamma, const at::Tensor& weight,
                           const at::Tensor& bias, bool gated) {
  if (gated && bias.defined()) return false;
  if (!gemv_takes(base, weight, bias)) return false;
  return gamma.numel() == base.size(-1) && norm_vector_fits(gamma, base) &&
         (!add.defined() || (add.sizes() == base.sizes() && norm_vector_fits(add, base)));
}

NormedLinear gemv_after_norm(const at::Tensor& base, const at::Tensor& add, const at::Tensor& gamma, double eps, const at::Tensor& weight,
                             const at::Tensor& bias, bool gated) {
  TORCH_CHECK(!gated || weight.size(0) % 2 == 0, "gemv_after_norm: the gated weight ", weight.sizes(), " is not [2f, k]");
  TORCH_CHECK(gemv_after_norm_takes(base, add, gamma, weight, bias, gated), "gemv_after_norm: base ", base.sizes(), ", weight ",
              weight.sizes(), " and gamma ", gamma.sizes(), " are not of a kind the kernel takes (gemv_after_norm_takes)");
  const InputNorm norm{add, gamma, eps};
  NormedLinear out;
  GemvCall call;
  call.gated = gated, call.norm = &norm, call.sum = &out.sum;
  out.y = run_gemv(base, weight, bias, call);
  return out;
}

bool gemv_into_norm_takes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& residual, const at::Tensor& gamma) {
  if (!gemv_takes(x, weight, {}) || weight.size(0) % cuda::kGemvRows != 0) return false;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = weight.size(0);
  return residual.defined() && gamma.defined() && residual.sizes() == at::IntArrayRef(shape) && norm_vector_fits(residual, x) &&
         gamma.dim() == 1 && gamma.numel() == weight.size(0) && norm_vector_fits(gamma, x);
}

PreparedNorm gemv_into_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& residual, const at::Tensor& gamma, double eps) {
  TORCH_CHECK(gemv_into_norm_takes(x, weight, residual, gamma), "gemv_into_norm: x ", x.sizes(), ", weight ", weight.sizes(), ", residual ",
              residual.sizes(), " and gamma ", gamma.sizes(), " are not of a kind the kernel takes (gemv_into_norm_takes)");
  PreparedNorm out;
  out.eps = eps;
  GemvCall call;
  call.into_norm = &out, call.residual = &residual, call.next_gamma = &gamma;
  run_gemv(x, weight, {}, call);
  return out;
}

bool gemv_after_prepared_norm_takes(const PreparedNorm& p, const at::Tensor& weight, const at::Tensor& bias, bool gated) {
  if (gated && bias.defined()) return false;
  if (!p.scaled.defined() || !gemv_takes(p.scaled, weight, bias)) return false;
  const at::Tensor& s = p.squares;
  return s.defined() && s.scalar_type() == at::kFloat && s.device() == p.scaled.device() && s.is_contiguous() && s.numel() > 0;
}

at::Tensor gemv_after_prepared_norm(const PreparedNorm& p, const at::Tensor& weight, const at::Tensor& bias, bool gated) {
  TORCH_CHECK(!gated || weight.size(0) % 2 == 0, "gemv_after_prepared_norm: the gated weight ", weight.sizes(), " is not [2f, k]");
  TORCH_CHECK(gemv_after_prepared_norm_takes(p, weight, bias, gated), "gemv_after_prepared_norm: the scaled row ",
              p.scaled.defined() ? p.scaled.sizes() : at::IntArrayRef{}, " and weight ", weight.sizes(),
              " are not of a kind the kernel takes (gemv_after_prepared_norm_takes)");
  GemvCall call;
  call.gated = gated, call.after_prepared = &p;
  return run_gemv(p.scaled, weight, bias, call);
}

namespace {

// The stores, tables and row the RoPE epilogue writes through fit x and the QKV weight.
bool rope_into_cache_fits(const at::Tensor& x, const at::Tensor& weight, const QkvIntoCache& into) {
  const at::Tensor& k = into.k_store;
  if (k.dim() != 3 || k.sizes() != into.v_store.sizes() || k.strides() != into.v_store.strides() || k.stride(2) != 1 ||
      k.scalar_type() != x.scalar_type() || k.device() != x.device()) {
    return false;
  }
  const int64_t groups = k.size(1), d = k.size(2);
  if (d % 4 != 0 || into.heads_per_group < 1 || weight.size(0) != groups * (into.heads_per_group + 2) * d) return false;
  for (const at::Tensor* table : {&into.cos, &into.sin}) {
    if (table->scalar_type() != at::kFloat || table->device() != x.device() || table->size(-1) != d || table->stride(-1) != 1) return false;
  }
  return into.store_rows.scalar_type() == at::kLong && into.store_rows.numel() == 1 && into.store_rows.device() == x.device();
}

}  // namespace

bool gemv_rope_into_cache_takes(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const QkvIntoCache& into,
                                const InputNorm* norm) {
  const bool gemv_fits = norm != nullptr ? gemv_after_norm_takes(x, norm->add, norm->gamma, weight, bias, false) : gemv_takes(x, weight, bias);
  return gemv_fits && rope_into_cache_fits(x, weight, into);
}

at::Tensor gemv_rope_into_cache(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const QkvIntoCache& into,
                                const InputNorm* norm, at::Tensor* sum) {
  TORCH_CHECK(gemv_rope_into_cache_takes(x, weight, bias, into, norm), "gemv_rope_into_cache: x ", x.sizes(), ", weight ", weight.sizes(),
              " and stores ", into.k_store.sizes(), " are not of a kind the kernel takes (gemv_rope_into_cache_takes)");
  at::Tensor residual;
  GemvCall call;
  call.norm = norm, call.sum = &residual, call.rope = &into;
  at::Tensor q = run_gemv(x, weight, bias, call);  // [..., H, d]
  if (sum != nullptr) *sum = residual;
  return q;
}

bool gemv_rope_into_cache_takes(const PreparedNorm& p, const at::Tensor& weight, const at::Tensor& bias, const QkvIntoCache& into) {
  return gemv_after_prepared_norm_takes(p, weight, bias, /*gated=*/false) && rope_into_cache_fits(p.scaled, weight, into);
}

at::Tensor gemv_rope_into_cache(const PreparedNorm& p, const at::Tensor& weight, const at::Tensor& bias, const QkvIntoCache& into) {
  TORCH_CHECK(gemv_rope_into_cache_takes(p, weight, bias, into), "gemv_rope_into_cache: the scaled row ",
              p.scaled.defined() ? p.scaled.sizes() : at::IntArrayRef{}, ", weight ", weight.sizes(), " and stores ", into.k_store.sizes(),
              " are not of a kind the kernel takes (gemv_rope_into_cache_takes)");
  GemvCall call;
  call.after_prepared = &p, call.rope = &into;
  return run_gemv(p.scaled, weight, bias, call);  // [..., H, d]
}

}  // namespace megatron::kernels
