#include "moe/experts.h"

#include <ATen/ATen.h>

#include "kernels/ops.h"

namespace megatron::moe {

GroupedExperts::GroupedExperts(const PartContext& ctx, int first_expert, int count)
    : grouped_gemm_(ctx.config.moe_grouped_gemm), swiglu_fusion_(ctx.config.bias_swiglu_fusion) {
  const ModelConfig& c = ctx.config;
  const int64_t f = c.expert_ffn_hidden_size() / ctx.tp.size(), h = c.hidden_size;
  const at::TensorOptions on = at::TensorOptions().device(ctx.device);
  auto linear_fc1 = register_module("linear_fc1", std::make_shared<tp::DescribedModule>());
  auto linear_fc2 = register_module("linear_fc2", std::make_shared<tp::DescribedModule>());
  for (int e = first_expert; e < first_expert + count; ++e) {
    tp::ParamInfo up;
    up.split = {0, /*gated=*/true};
    up.expert = e;
    up.grad_group = tp::GradGroup::ExpertDataParallel;
    fc1.push_back(linear_fc1->add_parameter("weight" + std::to_string(e), at::empty({2 * f, h}, on), up));
  }
  for (int e = first_expert; e < first_expert + count; ++e) {
    tp::ParamInfo down;
    down.split = {1, false};
    down.init = tp::Init::ScaledNormal;
    down.expert = e;
    down.grad_group = tp::GradGroup::ExpertDataParallel;
    fc2.push_back(linear_fc2->add_parameter("weight" + std::to_string(e), at::empty({h, f}, on), down));
  }
}

at::Tensor GroupedExperts::activation(const at::Tensor& h) const {
  if (swiglu_fusion_) return kernels::swiglu(h);
  auto gate_up = h.chunk(2, -1);
  return at::silu(gate_up[0]) * gate_up[1];
}

at::Tensor GroupedExperts::forward(const at::Tensor& rows, const std::vector<int64_t>& counts) const {
  TORCH_CHECK(counts.size() == fc1.size(), "GroupedExperts: ", counts.size(), " row counts for ", fc1.size(), " experts");
  if (grouped_gemm_ && rows.is_cuda()) return grouped(rows, counts);
  std::vector<at::Tensor> outputs;
  int64_t begin = 0;
  for (size_t e = 0; e < fc1.size(); ++e) {
    const at::Tensor x = rows.narrow(0, begin, counts[e]);  // [n_e, h]
    begin += counts[e];
    outputs.push_back(at::linear(activation(at::linear(x, fc1[e])), fc2[e]));  // [n_e, h]
  }
  if (outputs.empty()) return rows.narrow(0, 0, 0);
  return at::cat(outputs, 0);  // [N, h]
}

at::Tensor GroupedExperts::grouped(const at::Tensor& rows, const std::vector<int64_t>& counts) const {
  // One kernel over all experts: offs holds where each expert's rows end.
  std::vector<int32_t> ends;
  int64_t end = 0;
  for (int64_t n : counts) ends.push_back(int32_t(end += n));
  const at::Tensor offs = at::tensor(ends, at::TensorOptions().dtype(at::kInt)).to(rows.device(), /*non_blocking=*/true);
  const at::Tensor w1 = at::stack(fc1).transpose(1, 2);  // [E, h, 2f/tp]
  const at::Tensor w2 = at::stack(fc2).transpose(1, 2);  // [E, f/tp, h]
  const at::Tensor h = activation(at::_grouped_mm(rows, w1, offs));  // [N, f/tp]
  return at::_grouped_mm(h.contiguous(), w2, offs);                  // [N, h]
}

}  // namespace megatron::moe
