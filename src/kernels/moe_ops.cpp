#include "kernels/moe_ops.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/cuda_dispatch.h"

namespace megatron::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType compute_type(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// src [N, h] -> [T, k, h]: the row of each pair (a zero row where slots < 0), in the compute type.
at::Tensor rows_of_pairs(const at::Tensor& src, const at::Tensor& slots, int64_t topk) {
  const int64_t n = src.size(0), h = src.size(1);
  const at::Tensor padded = at::cat({src.to(compute_type(src)), at::zeros({1, h}, src.options().dtype(compute_type(src)))});
  const at::Tensor index = at::where(slots < 0, at::full({}, n, slots.options()), slots);
  return padded.index_select(0, index).view({slots.numel() / topk, topk, h});
}

// out[t] = sum over j of weights[t, j] * src[slots[t k + j]]; weights undefined: all 1.
at::Tensor gather_sum(const at::Tensor& src, const at::Tensor& slots, const at::Tensor& weights, int64_t topk, Impl impl) {
  const int64_t tokens = slots.numel() / topk, h = src.size(1);
  if (!uses_kernel(src, impl)) {
    at::Tensor g = rows_of_pairs(src, slots, topk);  // [T, k, h]
    if (weights.defined()) g = g * weights.to(g.scalar_type()).view({tokens, topk, 1});
    return g.sum(1).to(src.scalar_type());
  }
  at::Tensor out = at::empty({tokens, h}, src.options());
#ifdef MEGATRON_WITH_CUDA_KERNELS
  const at::Tensor w = weights.defined() ? weights.to(at::kFloat).contiguous() : at::Tensor();
  cuda::moe_gather_sum(src.data_ptr(), slots.data_ptr<int64_t>(), w.defined() ? w.data_ptr<float>() : nullptr,
                       out.data_ptr(), tokens, topk, h, storage_type(src), current_stream());
#endif
  return out;
}

// out[r] = weights[pairs[r]] * src[pairs[r] / k], zero where pairs[r] < 0; weights undefined: all 1.
at::Tensor expand_rows(const at::Tensor& src, const at::Tensor& pairs, const at::Tensor& weights, int64_t topk, Impl impl) {
  const int64_t rows = pairs.numel(), h = src.size(1);
  if (!uses_kernel(src, impl)) {
    const at::Tensor valid = pairs >= 0, pair = pairs.clamp_min(0);
    at::Tensor out = src.index_select(0, at::floor_divide(pair, topk));  // [N, h]
    if (weights.defined()) {
      out = (out.to(compute_type(src)) * weights.reshape({-1}).index_select(0, pair).to(compute_type(src)).unsqueeze(1))
                .to(src.scalar_type());
    }
    return at::where(valid.unsqueeze(1), out, at::zeros({}, out.options()));
  }
  at::Tensor out = at::empty({rows, h}, src.options());
#ifdef MEGATRON_WITH_CUDA_KERNELS
  const at::Tensor w = weights.defined() ? weights.to(at::kFloat).contiguous() : at::Tensor();
  cuda::moe_expand_rows(src.data_ptr(), pairs.data_ptr<int64_t>(), w.defined() ? w.data_ptr<float>() : nullptr,
                        out.data_ptr(), rows, topk, h, storage_type(src), current_stream());
#endif
  return out;
}

// [T, k] fp32: <a[t], b[slots[t k + j]]>, 0 where slots < 0.
at::Tensor pair_dots(const at::Tensor& a, const at::Tensor& b, const at::Tensor& slots, int64_t topk, Impl impl) {
  const int64_t tokens = slots.numel() / topk, h = a.size(1);
  if (!uses_kernel(a, impl)) {
    return (rows_of_pairs(b, slots, topk) * a.to(compute_type(a)).unsqueeze(1)).sum(-1);
  }
  at::Tensor out = at::empty({tokens, topk}, a.options().dtype(at::kFloat));
#ifdef MEGATRON_WITH_CUDA_KERNELS
  cuda::moe_pair_dots(a.data_ptr(), b.data_ptr(), slots.data_ptr<int64_t>(), out.data_ptr<float>(), slots.numel(), topk, h,
                      storage_type(a), current_stream());
#endif
  return out;
}

void check_maps(const at::Tensor& pairs, const at::Tensor& slots, int64_t topk, const char* who) {
  TORCH_CHECK(pairs.dim() == 1 && pairs.scalar_type() == at::kLong && slots.dim() == 1 && slots.scalar_type() == at::kLong,
              who, ": pairs and slots must be 1-D int64");
  TORCH_CHECK(topk > 0 && slots.numel() % topk == 0, who, ": ", slots.numel(), " slots for top-", topk);
}

struct PermuteFunction : torch::autograd::Function<PermuteFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& tokens, const at::Tensor& pairs, const at::Tensor& slots,
                            int64_t topk, int64_t impl) {
    ctx->save_for_backward({pairs, slots});
    ctx->saved_data["topk"] = topk;
    ctx->saved_data["impl"] = impl;
    return expand_rows(tokens, pairs, {}, topk, static_cast<Impl>(impl));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t topk = ctx->saved_data["topk"].toInt();
    const auto impl = static_cast<Impl>(ctx->saved_data["impl"].toInt());
    return {gather_sum(grads[0].contiguous(), saved[1], {}, topk, impl), {}, {}, {}, {}};
  }
};

struct UnpermuteFunction : torch::autograd::Function<UnpermuteFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& probs, const at::Tensor& pairs,
                            const at::Tensor& slots, int64_t impl) {
    ctx->save_for_backward({rows, probs, pairs, slots});
    ctx->saved_data["impl"] = impl;
    return gather_sum(rows, slots, probs, probs.size(1), static_cast<Impl>(impl));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &rows = saved[0], &probs = saved[1], &pairs = saved[2], &slots = saved[3];
    const auto impl = static_cast<Impl>(ctx->saved_data["impl"].toInt());
    const int64_t topk = probs.size(1);
    const at::Tensor dout = grads[0].to(rows.scalar_type()).contiguous();  // [T, h]
    const at::Tensor drows = expand_rows(dout, pairs, probs, topk, impl);   // [N, h]
    const at::Tensor dprobs = pair_dots(dout, rows, slots, topk, impl).to(probs.scalar_type());  // [T, k]
    return {drows, dprobs, {}, {}, {}};
  }
};

}  // namespace

at::Tensor moe_permute(const at::Tensor& tokens, const at::Tensor& pairs, const at::Tensor& slots, int64_t topk, Impl impl) {
  check_maps(pairs, slots, topk, "moe_permute");
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) * topk == slots.numel(), "moe_permute: tokens ", tokens.sizes(), " for ",
              slots.numel(), " slots of top-", topk);
  return PermuteFunction::apply(tokens.contiguous(), pairs, slots, topk, static_cast<int64_t>(impl));
}

at::Tensor moe_unpermute(const at::Tensor& rows, const at::Tensor& probs, const at::Tensor& pairs, const at::Tensor& slots,
                         Impl impl) {
  TORCH_CHECK(probs.dim() == 2, "moe_unpermute: probs must be [T, k], got ", probs.sizes());
  check_maps(pairs, slots, probs.size(1), "moe_unpermute");
  TORCH_CHECK(rows.dim() == 2 && rows.size(0) == pairs.numel() && probs.numel() == slots.numel(), "moe_unpermute: rows ",
              rows.sizes(), ", probs ", probs.sizes(), " for ", pairs.numel(), " pairs and ", slots.numel(), " slots");
  return UnpermuteFunction::apply(rows.contiguous(), probs.contiguous(), pairs, slots, static_cast<int64_t>(impl));
}

}  // namespace megatron::kernels
