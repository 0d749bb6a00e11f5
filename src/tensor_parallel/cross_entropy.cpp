#include "tensor_parallel/cross_entropy.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/ops.h"
#include "tensor_parallel/group_capsule.h"

namespace megatron::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            const dist::Group& tp) {
    const int64_t rows = logits.size(-1);
    const int64_t first = tp.rank() * rows;
    at::Tensor x = logits.to(at::kFloat).contiguous();                    // [s, b, V/tp]
    if (logits.scalar_type() == at::kFloat) x = x.clone();
    at::Tensor max = std::get<0>(x.max(-1)).contiguous();                 // [s, b]
    tp.all_reduce(max, dist::ReduceOp::Max);
    x.sub_(max.unsqueeze(-1));
    at::Tensor outside = (targets < first).logical_or(targets >= first + rows);
    at::Tensor local = (targets - first).masked_fill(outside, 0);         // [s, b]
    at::Tensor target_logit = x.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0).contiguous();
    tp.all_reduce(target_logit);
    x.exp_();                                                             // [s, b, V/tp] exp(logit - max)
    at::Tensor sum = x.sum(-1).contiguous();                              // [s, b]
    tp.all_reduce(sum);
    at::Tensor loss = sum.log() - target_logit;                           // [s, b]
    x.div_(sum.unsqueeze(-1));                                            // softmax, kept for backward
    ctx->save_for_backward({x, local, outside});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0].clone();                                   // softmax [s, b, V/tp]
    at::Tensor is_mine = saved[2].logical_not().to(at::kFloat).unsqueeze(-1);
    grad.scatter_add_(-1, saved[1].unsqueeze(-1), -is_mine);              // softmax - one_hot(target)
    grad.mul_(grads[0].unsqueeze(-1));
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype), at::Tensor(), at::Tensor()};
  }
};

struct FusedVocabParallelCrossEntropy : torch::autograd::Function<FusedVocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets,
                            const dist::Group& tp) {
    const int64_t vocab = logits.size(-1);
    const int64_t first = tp.rank() * vocab;
    at::Tensor x = logits.contiguous().view({-1, vocab});                 // [s*b, V/tp]
    at::Tensor t = targets.contiguous().view({-1});                       // [s*b]
    kernels::CrossEntropyStats st = kernels::cross_entropy_stats(x, t, first);
    at::Tensor max = st.max, sum = st.sum_exp;                            // [s*b] fp32 (fp64 logits: fp64)
    if (tp.size() > 1) {
      // Slices combine as (global max M, sum_r sum_exp_r * exp(max_r - M)).
      max = st.max.clone();
      tp.all_reduce(max, dist::ReduceOp::Max);
      sum = st.sum_exp * (st.max - max).exp();
      tp.all_reduce(sum);
      tp.all_reduce(st.target_logit);
    }
    ctx->save_for_backward({x, t, max, sum});
    ctx->saved_data["first"] = first;
    return (sum.log() + max - st.target_logit).view(targets.sizes());    // [s, b]
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor grad_loss = grads[0].to(saved[2].scalar_type()).contiguous().view({-1});  // the statistics' type
    at::Tensor grad = kernels::cross_entropy_backward(saved[0], saved[1], saved[2], saved[3], grad_loss,
                                                      ctx->saved_data["first"].toInt());
    std::vector<int64_t> shape = grads[0].sizes().vec();
    shape.push_back(saved[0].size(1));
    return {grad.view(shape), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor fused_vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, const dist::Group& tp) {
  return FusedVocabParallelCrossEntropy::apply(logits, targets, tp);
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, const dist::Group& tp) {
  return VocabParallelCrossEntropy::apply(logits, targets, tp);
}

}  // namespace megatron::tp
