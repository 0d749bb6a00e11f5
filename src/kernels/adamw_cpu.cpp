// The CPU AdamW step; see adamw_cpu.h.
#include "kernels/adamw_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/parallel.h"

namespace megatron::kernels {
namespace {

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
inline float to_float(c10::Half x) { return static_cast<float>(x); }
template <typename T>
inline T from_float(float x) {
  return static_cast<T>(x);  // bf16: round to nearest even, as __float2bfloat16
}

inline uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
inline float float_of(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

struct Scalars {
  float scale, bias_correction2_sqrt, lr, step_size, beta1, beta2, eps, weight_decay;
};

// Master element i: fp32, or the bf16 weight (high half) plus the int16 remainder.
template <typename M, typename V, typename G, typename Model, bool Remainder>
void step_range(float* master, int16_t* remainder, M* exp_avg, V* exp_avg_sq, const G* grad, Model* model, int64_t begin,
                int64_t end, const Scalars& s) {
  for (int64_t i = begin; i < end; ++i) {
    float p;
    if constexpr (Remainder) {
      uint16_t high;
      std::memcpy(&high, reinterpret_cast<const uint16_t*>(model) + i, 2);
      p = float_of((uint32_t(high) << 16) + uint32_t(int32_t(remainder[i])));
    } else {
      p = master[i];
    }
    float m = to_float(exp_avg[i]), v = to_float(exp_avg_sq[i]);
    // The order of operations of the CUDA kernel (and ATen's fused AdamW).
    const float g = to_float(grad[i]) / s.scale;
    p -= s.lr * s.weight_decay * p;
    m = s.beta1 * m + (1.0f - s.beta1) * g;
    v = s.beta2 * v + (1.0f - s.beta2) * g * g;
    const float denom = std::sqrt(v) / s.bias_correction2_sqrt + s.eps;
    p -= s.step_size * m / denom;
    exp_avg[i] = from_float<M>(m);
    exp_avg_sq[i] = from_float<V>(v);
    if constexpr (Remainder) {
      // The high half rounded half away from zero; the remainder what it leaves.
      const uint32_t b = bits_of(p), top = (b + 0x8000u) >> 16;
      const uint16_t high = uint16_t(top);
      std::memcpy(reinterpret_cast<uint16_t*>(model) + i, &high, 2);
      remainder[i] = int16_t(int32_t(b - (top << 16)));
    } else {
      master[i] = p;
      if constexpr (!std::is_void_v<Model>) model[i] = from_float<Model>(p);
    }
  }
}

template <typename M, typename V, typename G, typename Model, bool Remainder>
void run(const at::Tensor& master, const at::Tensor& m, const at::Tensor& v, const at::Tensor& g, const at::Tensor& model,
         const Scalars& s) {
  float* p = Remainder ? nullptr : master.data_ptr<float>();
  int16_t* r = Remainder ? master.data_ptr<int16_t>() : nullptr;
  M* mp = static_cast<M*>(m.data_ptr());
  V* vp = static_cast<V*>(v.data_ptr());
  const G* gp = static_cast<const G*>(g.data_ptr());
  Model* out = nullptr;
  if constexpr (!std::is_void_v<Model>) out = static_cast<Model*>(model.data_ptr());
  // Contiguous ranges of whole cache lines over the rank's intra-op threads (core/parallel.h:
  // at::parallel_for would run serially here).
  parallel_ranges(master.numel(), at::get_num_threads(), int64_t(1) << 16, 64, [&](int64_t begin, int64_t end) {
    step_range<M, V, G, Model, Remainder>(p, r, mp, vp, gp, out, begin, end, s);
  });
}

// Dispatch over the storage types, one level at a time.
template <typename M, typename V, typename G>
void with_model(const at::Tensor& master, const at::Tensor& m, const at::Tensor& v, const at::Tensor& g, const at::Tensor& model,
                bool remainder, const Scalars& s) {
  if (remainder) return run<M, V, G, c10::BFloat16, true>(master, m, v, g, model, s);
  if (!model.defined()) return run<M, V, G, void, false>(master, m, v, g, model, s);
  switch (model.scalar_type()) {
    case at::kBFloat16: return run<M, V, G, c10::BFloat16, false>(master, m, v, g, model, s);
    case at::kHalf: return run<M, V, G, c10::Half, false>(master, m, v, g, model, s);  // --fp16
    case at::kFloat: return run<M, V, G, float, false>(master, m, v, g, model, s);
    default: TORCH_CHECK(false, "adamw_step_cpu: model weights must be fp32, bf16 or fp16, not ", model.scalar_type());
  }
}
template <typename M, typename V>
void with_grad(const at::Tensor& master, const at::Tensor& m, const at::Tensor& v, const at::Tensor& g, const at::Tensor& model,
               bool remainder, const Scalars& s) {
  if (g.scalar_type() == at::kBFloat16) return with_model<M, V, c10::BFloat16>(master, m, v, g, model, remainder, s);
  return with_model<M, V, float>(master, m, v, g, model, remainder, s);
}
template <typename M>
void with_second_moment(const at::Tensor& master, const at::Tensor& m, const at::Tensor& v, const at::Tensor& g,
                        const at::Tensor& model, bool remainder, const Scalars& s) {
  if (v.scalar_type() == at::kBFloat16) return with_grad<M, c10::BFloat16>(master, m, v, g, model, remainder, s);
  return with_grad<M, float>(master, m, v, g, model, remainder, s);
}

}  // namespace

void adamw_step_cpu(const at::Tensor& master, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq, const at::Tensor& grad,
                    const at::Tensor& model, const AdamWHyperparameters& h, const AdamWStepScalars& st) {
  if (st.found_inf.item<float>() != 0.0f) return;  // a skipped iteration
  const float* corrections = st.bias_corrections.data_ptr<float>();
  Scalars s;
  s.scale = st.grad_scale.item<float>();
  s.bias_correction2_sqrt = corrections[1];
  s.lr = static_cast<float>(st.lr.item<double>());
  s.step_size = s.lr / corrections[0];
  s.beta1 = static_cast<float>(h.beta1), s.beta2 = static_cast<float>(h.beta2);
  s.eps = static_cast<float>(h.eps), s.weight_decay = static_cast<float>(h.weight_decay);
  const bool remainder = master.scalar_type() == at::kShort;
  if (exp_avg.scalar_type() == at::kBFloat16) return with_second_moment<c10::BFloat16>(master, exp_avg, exp_avg_sq, grad, model, remainder, s);
  with_second_moment<float>(master, exp_avg, exp_avg_sq, grad, model, remainder, s);
}

}  // namespace megatron::kernels
