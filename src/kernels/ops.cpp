#include "kernels/ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "kernels/adamw_cpu.h"
#include "kernels/cuda_dispatch.h"

namespace megatron::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType compute_type(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// ---- RoPE ----------------------------------------------------------------------------------

// Composite rotate-half: x * cos + rotate_half(x) * sin on the rotated channels, computed in
// fp32; `inverse` applies the transpose (x * cos + rotate_half^T(x * sin)).
at::Tensor rope_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
  const int64_t rot = cos.size(-1), half = rot / 2, s = x.size(0);
  at::Tensor xf = x.to(compute_type(x));
  at::Tensor c = cos.narrow(0, 0, s), sn = sin.narrow(0, 0, s);     // [s, 1|b, 1, rot]
  at::Tensor r = xf.narrow(-1, 0, rot);
  at::Tensor out;
  if (!inverse) {
    out = r * c + at::cat({-r.narrow(-1, half, half), r.narrow(-1, 0, half)}, -1) * sn;
  } else {
    at::Tensor u = r * sn;
    out = r * c + at::cat({u.narrow(-1, half, half), -u.narrow(-1, 0, half)}, -1);
  }
  if (rot < x.size(-1)) out = at::cat({out, xf.narrow(-1, rot, x.size(-1) - rot)}, -1);
  return out.to(x.scalar_type()).contiguous();
}

// x and y: [s, b, n, d], or [s, b, G, n / G, d] for heads in groups (either or both), any strides
// with d contiguous: y = the rotation of x (`inverse`: its transpose), on the kernel.
void rope_kernel_into(const at::Tensor& x, const at::Tensor& y, const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
#ifdef MEGATRON_WITH_CUDA_KERNELS
  const int64_t n = x.dim() == 5 ? x.size(2) * x.size(3) : x.size(2);
  const int64_t per_group = x.dim() == 5 ? x.size(3) : y.dim() == 5 ? y.size(3) : n;
  // A head h sits at (h / per_group) * group stride + (h % per_group) * head stride; ungrouped
  // heads are evenly spaced, so their group stride is per_group head strides.
  auto group_stride = [per_group](const at::Tensor& t) { return t.dim() == 5 ? t.stride(2) : per_group * t.stride(2); };
  cuda::RopeArgs a{};
  a.x = x.data_ptr();
  a.y = y.data_ptr();
  a.cos = cos.data_ptr<float>();
  a.sin = sin.data_ptr<float>();
  a.s = x.size(0), a.b = x.size(1), a.n = n, a.d = x.size(-1), a.rot_dim = cos.size(-1);
  a.heads_per_group = per_group;
  a.x_stride_s = x.stride(0), a.x_stride_b = x.stride(1), a.x_stride_n = x.stride(-2), a.x_stride_group = group_stride(x);
  a.y_stride_s = y.stride(0), a.y_stride_b = y.stride(1), a.y_stride_n = y.stride(-2), a.y_stride_group = group_stride(y);
  a.table_stride_s = cos.stride(0);
  a.table_stride_b = cos.size(1) == 1 ? 0 : cos.stride(1);
  a.dtype = storage_type(x);
  a.inverse = inverse;
  cuda::rope(a, current_stream());
#endif
}

// x: [s, b, n, d], or [s, b, G, n / G, d] for heads in groups; returns y: [s, b, n, d].
at::Tensor rope_apply(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse, Impl impl) {
  const int64_t n = x.dim() == 5 ? x.size(2) * x.size(3) : x.size(2);
  if (!uses_kernel(x, impl)) {
    return rope_composite(x.dim() == 5 ? x.reshape({x.size(0), x.size(1), n, x.size(-1)}) : x, cos, sin, inverse);
  }
  at::Tensor y = at::empty({x.size(0), x.size(1), n, x.size(-1)}, x.options());
  rope_kernel_into(x, y, cos, sin, inverse);
  return y;
}

// The same, written into y (a view, e.g. a slot of a gradient being assembled).
void rope_into(const at::Tensor& x, const at::Tensor& y, const at::Tensor& cos, const at::Tensor& sin, bool inverse,
               Impl impl) {
  if (uses_kernel(x, impl)) {
    rope_kernel_into(x, y, cos, sin, inverse);
  } else {
    y.copy_(rope_apply(x, cos, sin, inverse, impl).view(y.sizes()));
  }
}

struct RopeFunction : torch::autograd::Function<RopeFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            int64_t impl) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["impl"] = impl;
    ctx->saved_data["shape"] = x.sizes().vec();
    return rope_apply(x, cos, sin, /*inverse=*/false, static_cast<Impl>(impl));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto impl = static_cast<Impl>(ctx->saved_data["impl"].toInt());
    const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
    return {rope_apply(grads[0].contiguous(), saved[0], saved[1], /*inverse=*/true, impl).view(shape), {}, {}, {}};
  }
};

// The three parts of the QKV output [s, b, G, (P + 2) * d]: q [s, b, G, P, d], k and v [s, b, G, d].
struct QkvParts {
  at::Tensor q, k, v;
};
QkvParts qkv_parts(const at::Tensor& qkv, int64_t per_group) {
  const int64_t d = qkv.size(-1) / (per_group + 2);
  auto parts = qkv.split_with_sizes({per_group * d, d, d}, -1);
  return {parts[0].view({qkv.size(0), qkv.size(1), qkv.size(2), per_group, d}), parts[1], parts[2]};
}

struct QkvRopeFunction : torch::autograd::Function<QkvRopeFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                               int64_t per_group, int64_t impl) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["impl"] = impl;
    ctx->saved_data["per_group"] = per_group;
    ctx->saved_data["shape"] = qkv.sizes().vec();
    const QkvParts in = qkv_parts(qkv, per_group);
    const auto i = static_cast<Impl>(impl);
    // v is copied (G / (H + 2G) of the output), so nothing keeps the whole QKV output alive.
    return {rope_apply(in.q, cos, sin, /*inverse=*/false, i), rope_apply(in.k, cos, sin, /*inverse=*/false, i),
            in.v.contiguous()};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto impl = static_cast<Impl>(ctx->saved_data["impl"].toInt());
    const at::TensorOptions options = (grads[0].defined() ? grads[0] : grads[1].defined() ? grads[1] : grads[2]).options();
    at::Tensor grad = at::empty(ctx->saved_data["shape"].toIntVector(), options);  // [s, b, G, (P + 2) * d]
    const QkvParts out = qkv_parts(grad, ctx->saved_data["per_group"].toInt());
    for (auto [dy, into] : {std::pair<const at::Tensor&, const at::Tensor&>{grads[0], out.q}, {grads[1], out.k}}) {
      if (!dy.defined()) {
        into.zero_();
      } else {
        rope_into(dy.stride(-1) == 1 ? dy : dy.contiguous(), into, saved[0], saved[1], /*inverse=*/true, impl);
      }
    }
    if (grads[2].defined()) {
      out.v.copy_(grads[2]);
    } else {
      out.v.zero_();
    }
    return {grad, {}, {}, {}, {}};
  }
};

// ---- SwiGLU --------------------------------------------------------------------------------

at::Tensor swiglu_forward(const at::Tensor& h, Impl impl) {
  const int64_t f = h.size(-1) / 2;
  if (!uses_kernel(h, impl)) {
    at::Tensor hf = h.to(compute_type(h));
    return (at::silu(hf.narrow(-1, 0, f)) * hf.narrow(-1, f, f)).to(h.scalar_type());
  }
#ifdef MEGATRON_WITH_CUDA_KERNELS
  std::vector<int64_t> shape = h.sizes().vec();
  shape.back() = f;
  at::Tensor out = at::empty(shape, h.options());
  cuda::swiglu_forward(h.data_ptr(), out.data_ptr(), h.numel() / (2 * f), f, storage_type(h), current_stream());
  return out;
#else
  return {};
#endif
}

at::Tensor swiglu_backward(const at::Tensor& grad_out, const at::Tensor& h, Impl impl) {
  const int64_t f = h.size(-1) / 2;
  if (!uses_kernel(h, impl)) {
    at::Tensor hf = h.to(compute_type(h)), dy = grad_out.to(compute_type(h));
    at::Tensor g = hf.narrow(-1, 0, f), u = hf.narrow(-1, f, f), sg = at::sigmoid(g);
    at::Tensor grad_gate = dy * u * sg * (1 + g * (1 - sg));
    at::Tensor grad_up = dy * g * sg;
    return at::cat({grad_gate, grad_up}, -1).to(h.scalar_type());
  }
#ifdef MEGATRON_WITH_CUDA_KERNELS
  at::Tensor grad_in = at::empty_like(h);
  cuda::swiglu_backward(grad_out.data_ptr(), h.data_ptr(), grad_in.data_ptr(), h.numel() / (2 * f), f,
                        storage_type(h), current_stream());
  return grad_in;
#else
  return {};
#endif
}

struct SwigluFunction : torch::autograd::Function<SwigluFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, int64_t impl) {
    at::Tensor in = h.contiguous();
    ctx->save_for_backward({in});
    ctx->saved_data["impl"] = impl;
    return swiglu_forward(in, static_cast<Impl>(impl));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto impl = static_cast<Impl>(ctx->saved_data["impl"].toInt());
    return {swiglu_backward(grads[0].contiguous(), ctx->get_saved_variables()[0], impl), {}};
  }
};

void check_cross_entropy_inputs(const at::Tensor& logits, const at::Tensor& targets) {
  TORCH_CHECK(logits.dim() == 2 && logits.is_contiguous(), "cross entropy: logits must be contiguous [rows, vocab]");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0) && targets.scalar_type() == at::kLong &&
                  targets.is_contiguous(),
              "cross entropy: targets must be contiguous int64 [rows]");
}

// ---- RMSNorm (and the residual add before it) ------------------------------------------------

// Whether t's data starts on a 16-byte boundary (the kernels' packed loads).
bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

bool rms_norm_kernel_applies(const at::Tensor& x, const at::Tensor& weight, Impl impl) {
  if (!uses_kernel(x, impl) || weight.scalar_type() != x.scalar_type() || !weight.is_contiguous() ||
      !aligned16(weight)) {
    return false;
  }
#ifdef MEGATRON_WITH_CUDA_KERNELS
  return cuda::rms_norm_supported(x.size(-1), storage_type(x));
#else
  return false;
#endif
}

#ifdef MEGATRON_WITH_CUDA_KERNELS
// A contiguous, 16-byte aligned tensor with t's values.
at::Tensor packed_input(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return aligned16(c) ? c : c.clone();
}
#endif

struct RmsNormForward {
  at::Tensor x;     // the normalised input: a itself, or the residual sum a + b
  at::Tensor y;     // x's shape
  at::Tensor rstd;  // [rows] fp32
};

RmsNormForward rms_norm_kernel_forward(const at::Tensor& a, const at::Tensor& b, const at::Tensor& weight, double eps) {
  RmsNormForward out;
#ifdef MEGATRON_WITH_CUDA_KERNELS
  const at::Tensor a_in = packed_input(a);
  const at::Tensor b_in = b.defined() ? packed_input(b) : b;
  const int64_t h = a.size(-1), rows = a.numel() / h;
  out.x = b.defined() ? at::empty_like(a_in) : a_in;
  out.y = at::empty_like(a_in);
  out.rstd = at::empty({rows}, a.options().dtype(at::kFloat));
  cuda::rms_norm_forward(a_in.data_ptr(), b.defined() ? b_in.data_ptr() : nullptr, weight.data_ptr(),
                         b.defined() ? out.x.data_ptr() : nullptr, out.y.data_ptr(), out.rstd.data_ptr<float>(), rows,
                         h, static_cast<float>(eps), storage_type(a), current_stream());
#endif
  return out;
}

// {grad_x (+ grad_extra), grad_weight}
std::pair<at::Tensor, at::Tensor> rms_norm_kernel_backward(const at::Tensor& grad_y, const at::Tensor& x,
                                                           const at::Tensor& weight, const at::Tensor& rstd,
                                                           const at::Tensor& grad_extra) {
#ifdef MEGATRON_WITH_CUDA_KERNELS
  const int64_t h = x.size(-1), rows = x.numel() / h;
  const at::Tensor dy = grad_y.defined() ? packed_input(grad_y) : at::zeros_like(x);
  const at::Tensor extra = grad_extra.defined() ? packed_input(grad_extra) : grad_extra;
  at::Tensor grad_x = at::empty_like(x), grad_weight = at::empty_like(weight);
  at::Tensor workspace = at::empty({cuda::rms_norm_backward_blocks(rows), h}, x.options().dtype(at::kFloat));
  cuda::rms_norm_backward(dy.data_ptr(), x.data_ptr(), weight.data_ptr(), rstd.data_ptr<float>(),
                          extra.defined() ? extra.data_ptr() : nullptr, grad_x.data_ptr(), grad_weight.data_ptr(),
                          workspace.data_ptr<float>(), rows, h, storage_type(x), current_stream());
  return {grad_x, grad_weight};
#else
  return {};
#endif
}

struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    RmsNormForward f = rms_norm_kernel_forward(x, {}, weight, eps);
    ctx->save_for_backward({f.x, weight, f.rstd});
    return f.y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto [grad_x, grad_weight] = rms_norm_kernel_backward(grads[0], saved[0], saved[1], saved[2], {});
    return {grad_x, grad_weight, {}};
  }
};

struct AddRmsNormFunction : torch::autograd::Function<AddRmsNormFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b, const at::Tensor& weight,
                               double eps) {
    RmsNormForward f = rms_norm_kernel_forward(a, b, weight, eps);
    ctx->save_for_backward({f.x, weight, f.rstd});
    return {f.x, f.y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    // The sum's gradient is what reached it directly plus what came through the norm; both
    // addends of the sum receive it.
    auto [grad_sum, grad_weight] = rms_norm_kernel_backward(grads[1], saved[0], saved[1], saved[2], grads[0]);
    return {grad_sum, grad_sum, grad_weight, {}};
  }
};

}  // namespace

bool built_with_kernels() {
#ifdef MEGATRON_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

bool uses_kernel(const at::Tensor& t, Impl impl) {
  const auto type = t.scalar_type();
  return impl == Impl::Auto && built_with_kernels() && t.is_cuda() &&
         (type == at::kFloat || type == at::kBFloat16 || type == at::kHalf);
}

namespace {
// The tables rope() and split_qkv_rope() take, for s positions of b samples with head size d.
void check_rope_tables(const at::Tensor& cos, const at::Tensor& sin, int64_t s, int64_t b, int64_t d, const char* who) {
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.dim() == 4 &&
                  cos.size(-1) % 2 == 0 && cos.size(-1) <= d && cos.size(0) >= s && (cos.size(1) == 1 || cos.size(1) == b),
              who, ": cos/sin must be fp32 [>= s, 1 or b, 1, even rot_dim <= d]");
}
}  // namespace

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, Impl impl) {
  TORCH_CHECK((x.dim() == 4 || x.dim() == 5) && x.stride(-1) == 1,
              "rope: x must be [s, b, n, d] or [s, b, groups, n / groups, d] with a contiguous last dimension");
  check_rope_tables(cos, sin, x.size(0), x.size(1), x.size(-1), "rope");
  // Tables gathered for per-sample positions come out of advanced indexing possibly permuted.
  return RopeFunction::apply(x, cos.contiguous(), sin.contiguous(), static_cast<int64_t>(impl));
}

QkvRope split_qkv_rope(const at::Tensor& qkv, int64_t heads_per_group, const at::Tensor& cos, const at::Tensor& sin,
                       Impl impl) {
  TORCH_CHECK(qkv.dim() == 4 && qkv.stride(-1) == 1 && heads_per_group > 0 && qkv.size(-1) % (heads_per_group + 2) == 0,
              "split_qkv_rope: qkv must be [s, b, groups, (heads_per_group + 2) * d] with a contiguous last dimension");
  check_rope_tables(cos, sin, qkv.size(0), qkv.size(1), qkv.size(-1) / (heads_per_group + 2), "split_qkv_rope");
  variable_list out = QkvRopeFunction::apply(qkv, cos.contiguous(), sin.contiguous(), heads_per_group, static_cast<int64_t>(impl));
  return {out[0], out[1], out[2]};
}

at::Tensor swiglu(const at::Tensor& h, Impl impl) {
  TORCH_CHECK(h.size(-1) % 2 == 0, "swiglu: the last dimension (", h.size(-1), ") must be [gate | up], even");
  return SwigluFunction::apply(h, static_cast<int64_t>(impl));
}

CrossEntropyStats cross_entropy_stats(const at::Tensor& logits, const at::Tensor& targets, int64_t first, Impl impl) {
  check_cross_entropy_inputs(logits, targets);
  [[maybe_unused]] const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  if (!uses_kernel(logits, impl)) {
    at::Tensor x = logits.to(compute_type(logits));
    at::Tensor max = std::get<0>(x.max(-1));
    at::Tensor sum_exp = (x - max.unsqueeze(-1)).exp().sum(-1);
    at::Tensor local = targets - first;
    at::Tensor mine = (local >= 0).logical_and(local < vocab);
    at::Tensor target = x.gather(-1, local.clamp(0, vocab - 1).unsqueeze(-1)).squeeze(-1).masked_fill(mine.logical_not(), 0);
    return {max, sum_exp, target};  // in the compute type: fp32, or fp64 for fp64 logits
  }
#ifdef MEGATRON_WITH_CUDA_KERNELS
  auto f32 = logits.options().dtype(at::kFloat);
  CrossEntropyStats s{at::empty({rows}, f32), at::empty({rows}, f32), at::empty({rows}, f32)};
  cuda::cross_entropy_stats(logits.data_ptr(), targets.data_ptr<int64_t>(), rows, vocab, first, storage_type(logits),
                            s.max.data_ptr<float>(), s.sum_exp.data_ptr<float>(), s.target_logit.data_ptr<float>(),
                            current_stream());
  return s;
#else
  return {};
#endif
}

at::Tensor cross_entropy_backward(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& max,
                                  const at::Tensor& sum_exp, const at::Tensor& grad_loss, int64_t first, Impl impl) {
  check_cross_entropy_inputs(logits, targets);
  [[maybe_unused]] const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  if (!uses_kernel(logits, impl)) {
    at::Tensor x = logits.to(compute_type(logits));
    at::Tensor grad = (x - max.unsqueeze(-1)).exp() / sum_exp.unsqueeze(-1);  // softmax
    at::Tensor local = targets - first;
    at::Tensor mine = (local >= 0).logical_and(local < vocab).to(grad.scalar_type());
    grad.scatter_add_(-1, local.clamp(0, vocab - 1).unsqueeze(-1), -mine.unsqueeze(-1));
    return (grad * grad_loss.unsqueeze(-1)).to(logits.scalar_type());
  }
#ifdef MEGATRON_WITH_CUDA_KERNELS
  TORCH_CHECK(max.is_contiguous() && sum_exp.is_contiguous() && grad_loss.is_contiguous() &&
                  grad_loss.scalar_type() == at::kFloat,
              "cross entropy backward: row statistics and grad_loss must be contiguous fp32 [rows]");
  at::Tensor grad = at::empty_like(logits);
  cuda::cross_entropy_backward(logits.data_ptr(), targets.data_ptr<int64_t>(), max.data_ptr<float>(),
                               sum_exp.data_ptr<float>(), grad_loss.data_ptr<float>(), grad.data_ptr(), rows, vocab,
                               first, storage_type(logits), current_stream());
  return grad;
#else
  return {};
#endif
}

AdamWStepScalars adamw_step_scalars(const at::Tensor& step, const at::Tensor& grad_scale, const at::Tensor& found_inf,
                                    const at::Tensor& lr, double beta1, double beta2) {
  const at::Tensor t = step.to(at::kDouble);
  at::Tensor corrections = at::stack({at::rsub(at::pow(beta1, t), 1.0), at::rsub(at::pow(beta2, t), 1.0).sqrt()});
  return {step, corrections.to(at::kFloat), grad_scale.to(at::kFloat), found_inf.to(at::kFloat), lr.to(at::kDouble)};
}

void accumulate_grad(const at::Tensor& dst, const at::Tensor& src, bool overwrite, Impl impl) {
  TORCH_CHECK(dst.numel() == src.numel(), "accumulate_grad: ", src.numel(), " elements into ", dst.numel());
  const bool kernel = uses_kernel(src, impl) && dst.is_cuda() && dst.scalar_type() == at::kFloat && dst.is_contiguous() &&
                      src.is_contiguous();
  if (!kernel) {
    at::NoGradGuard no_grad;
    overwrite ? dst.copy_(src.reshape(dst.sizes())) : dst.add_(src.reshape(dst.sizes()));
    return;
  }
#ifdef MEGATRON_WITH_CUDA_KERNELS
  cuda::accumulate_into_fp32(dst.data_ptr<float>(), src.data_ptr(), src.numel(), storage_type(src), overwrite, current_stream());
#endif
}

void adamw_step(const at::Tensor& master, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                const at::Tensor& grad, const at::Tensor& model, const AdamWHyperparameters& h,
                const AdamWStepScalars& s, Impl impl) {
  const bool remainder = master.scalar_type() == at::kShort;
  TORCH_CHECK((master.scalar_type() == at::kFloat || remainder) && master.is_contiguous(),
              "adamw_step: the master must be contiguous fp32, or int16 remainders");
  TORCH_CHECK(!remainder || (model.scalar_type() == at::kBFloat16 && !model.is_same(master)),
              "adamw_step: int16 master remainders need the bf16 model weights they complete");
  for (const at::Tensor* t : {&exp_avg, &exp_avg_sq}) {
    TORCH_CHECK((t->scalar_type() == at::kFloat || t->scalar_type() == at::kBFloat16) && t->is_contiguous() &&
                    t->numel() == master.numel(),
                "adamw_step: the moments must be contiguous fp32 or bf16, one element per master weight");
  }
  TORCH_CHECK((grad.scalar_type() == at::kFloat || grad.scalar_type() == at::kBFloat16) && grad.is_contiguous() &&
                  grad.numel() == master.numel(),
              "adamw_step: the gradient must be contiguous fp32 or bf16, one element per master weight");
  TORCH_CHECK(model.is_contiguous() && model.numel() == master.numel(), "adamw_step: model must match the master");
  for (const at::Tensor* t : {&s.step, &s.bias_corrections, &s.grad_scale, &s.found_inf}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous() && t->device() == master.device(),
                "adamw_step: the step's scalars must be fp32 on the parameters' device (adamw_step_scalars)");
  }
  TORCH_CHECK(s.lr.scalar_type() == at::kDouble && s.lr.numel() == 1 && s.lr.device() == master.device(),
              "adamw_step: the learning rate must be a [] fp64 tensor on the parameters' device");
  const bool own_model = !model.is_same(master);
  if (master.is_cpu() && impl == Impl::Auto) {
    // One pass with the CUDA kernel's arithmetic, over the host's threads (kernels/adamw_cpu.h).
    adamw_step_cpu(master, exp_avg, exp_avg_sq, grad, own_model ? model : at::Tensor(), h, s);
    return;
  }
  // Remainder masters are int16: whether the kernel applies is the bf16 weights' question.
  if (!uses_kernel(remainder ? model : master, impl)) {
    // The reference path (the CUDA tests' comparison, and CUDA without our kernels): ATen's fused
    // AdamW; the learning rate is read back to the host for it.
    // bf16 moments (and remainder masters) step in fp32 copies, rounded back once, as the kernel does.
    const at::Tensor m = exp_avg.to(at::kFloat), v = exp_avg_sq.to(at::kFloat);
    const at::Tensor p = remainder ? join_master(model, master) : master;
    at::_fused_adamw_({p}, {grad.to(at::kFloat)}, {m}, {v}, {}, {s.step}, s.lr.item<double>(),
                      h.beta1, h.beta2, h.weight_decay, h.eps, /*amsgrad=*/false, /*maximize=*/false, s.grad_scale,
                      s.found_inf);
    if (!m.is_same(exp_avg)) exp_avg.copy_(m);
    if (!v.is_same(exp_avg_sq)) exp_avg_sq.copy_(v);
    if (remainder) {
      split_master(p, model, master);
    } else if (own_model) {
      model.copy_(master);
    }
    return;
  }
#ifdef MEGATRON_WITH_CUDA_KERNELS
  cuda::AdamWArgs a{};
  a.master = master.data_ptr();
  a.master_remainder = remainder;
  a.exp_avg = exp_avg.data_ptr();
  a.exp_avg_sq = exp_avg_sq.data_ptr();
  a.exp_avg_dtype = storage_type(exp_avg);
  a.exp_avg_sq_dtype = storage_type(exp_avg_sq);
  a.grad = grad.data_ptr();
  a.grad_dtype = storage_type(grad);
  a.model = own_model ? model.data_ptr() : nullptr;
  a.model_dtype = storage_type(model);
  a.n = master.numel();
  a.lr = s.lr.data_ptr<double>();
  a.beta1 = static_cast<float>(h.beta1), a.beta2 = static_cast<float>(h.beta2);
  a.eps = static_cast<float>(h.eps), a.weight_decay = static_cast<float>(h.weight_decay);
  a.bias_corrections = s.bias_corrections.data_ptr<float>();
  a.grad_scale = s.grad_scale.data_ptr<float>();
  a.found_inf = s.found_inf.data_ptr<float>();
  cuda::adamw_step(a, current_stream());
#endif
}

at::Tensor join_master(const at::Tensor& model_bf16, const at::Tensor& remainder) {
  TORCH_CHECK(model_bf16.scalar_type() == at::kBFloat16 && remainder.scalar_type() == at::kShort &&
                  model_bf16.numel() == remainder.numel() && model_bf16.is_contiguous(),
              "join_master: bf16 weights and int16 remainders of one size");
  // In int64: (high << 16) + remainder, taken mod 2^32 as the fp32 bit pattern.
  const at::Tensor high = model_bf16.reshape({-1}).view(at::kShort).to(at::kLong).bitwise_and(0xFFFF);
  const at::Tensor bits = high.bitwise_left_shift(16).add(remainder.reshape({-1}).to(at::kLong)).bitwise_and(0xFFFFFFFFLL);
  return at::where(bits >= (int64_t(1) << 31), bits - (int64_t(1) << 32), bits).to(at::kInt).view(at::kFloat);
}

void split_master(const at::Tensor& master, const at::Tensor& model_bf16, const at::Tensor& remainder) {
  TORCH_CHECK(master.scalar_type() == at::kFloat && model_bf16.scalar_type() == at::kBFloat16 &&
                  remainder.scalar_type() == at::kShort && master.numel() == model_bf16.numel() &&
                  master.numel() == remainder.numel(),
              "split_master: fp32 masters into bf16 weights and int16 remainders of one size");
  at::NoGradGuard no_grad;
  const at::Tensor bits = master.contiguous().view(at::kInt).to(at::kLong).bitwise_and(0xFFFFFFFFLL);  // as uint32
  const at::Tensor top = (bits + 0x8000).bitwise_right_shift(16).bitwise_and(0xFFFF);  // rounded half away from zero
  const at::Tensor low = bits - top.bitwise_left_shift(16);                             // in [-2^15, 2^15)
  const at::Tensor high16 = at::where(top >= 0x8000, top - 0x10000, top).to(at::kShort);
  model_bf16.view(at::kShort).copy_(high16.view(model_bf16.sizes()));
  remainder.copy_(low.to(at::kShort).view(remainder.sizes()));
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, Impl impl) {
  if (!rms_norm_kernel_applies(x, weight, impl)) return at::rms_norm(x, {x.size(-1)}, weight, eps);
  return RmsNormFunction::apply(x, weight, eps);
}

AddRmsNorm add_rms_norm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& weight, double eps, Impl impl) {
  TORCH_CHECK(a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type(), "add_rms_norm: a and b must match");
  if (!rms_norm_kernel_applies(a, weight, impl)) {
    at::Tensor sum = a + b;
    return {sum, rms_norm(sum, weight, eps, impl)};
  }
  variable_list out = AddRmsNormFunction::apply(a, b, weight, eps);
  return {out[0], out[1]};
}

at::Tensor argmax_rows(const at::Tensor& x, Impl impl) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) > 0, "argmax_rows: x must be [rows, n] with n >= 1, got ", x.sizes());
  if (!uses_kernel(x, impl) || x.stride(1) != 1 || x.size(0) > INT32_MAX) return x.argmax(-1);
#ifdef MEGATRON_WITH_CUDA_KERNELS
  at::Tensor out = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  cuda::row_argmax(cuda::RowArgmaxArgs{x.data_ptr(), out.data_ptr<int64_t>(), x.size(0), x.size(1), x.stride(0), storage_type(x)},
                   current_stream());
  return out;
#else
  return {};
#endif
}

}  // namespace megatron::kernels
