#include "moe/experts.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "kernels/ops.h"
#include "tensor_parallel/grad_accumulation.h"
#include "tensor_parallel/recompute.h"

namespace megatron::moe {

GroupedExperts::GroupedExperts(const PartContext& ctx, int first_expert, int count)
    : grouped_gemm_(ctx.config.moe_grouped_gemm),
      swiglu_fusion_(ctx.config.bias_swiglu_fusion),
      recompute_activation_(ctx.config.selectively_recomputes("moe_act")) {
  const ModelConfig& c = ctx.config;
  const int64_t f = c.expert_ffn_hidden_size() / ctx.tp.expert_group.size(), h = c.hidden_size;  // split over expert TP
  const at::TensorOptions on = at::TensorOptions().device(ctx.device);
  auto linear_fc1 = register_module("linear_fc1", std::make_shared<tp::DescribedModule>());
  auto linear_fc2 = register_module("linear_fc2", std::make_shared<tp::DescribedModule>());
  fc1.resize(size_t(count));
  fc2.resize(size_t(count));
  // Registered last expert first: the gradient buffer lays parameters out in reverse
  // registration order, so each layer's experts end up side by side in ascending order and the
  // grouped GEMM reads them in place (tp::stacked).
  for (int e = first_expert + count - 1; e >= first_expert; --e) {
    tp::ParamInfo up;
    up.split = {0, /*gated=*/true};
    up.expert = e;
    up.grad_group = tp::GradGroup::ExpertDataParallel;
    fc1[size_t(e - first_expert)] = linear_fc1->add_parameter("weight" + std::to_string(e), at::empty({2 * f, h}, on), up);
  }
  for (int e = first_expert + count - 1; e >= first_expert; --e) {
    tp::ParamInfo down;
    down.split = {1, false};
    down.init = tp::Init::ScaledNormal;
    down.expert = e;
    down.grad_group = tp::GradGroup::ExpertDataParallel;
    fc2[size_t(e - first_expert)] = linear_fc2->add_parameter("weight" + std::to_string(e), at::empty({h, f}, on), down);
  }
  if (ctx.fp8) {
    const std::string layer = "layer " + std::to_string(ctx.layer + 1) + " experts' ";
    fp8_fc1_ = std::make_unique<Fp8GroupedLinear>(ctx.fp8, layer + "linear_fc1");
    fp8_fc2_ = std::make_unique<Fp8GroupedLinear>(ctx.fp8, layer + "linear_fc2");
  }
}

namespace {

at::Tensor swiglu(const at::Tensor& h, bool fused) {
  if (fused) return kernels::swiglu(h);
  auto gate_up = h.chunk(2, -1);
  return at::silu(gate_up[0]) * gate_up[1];
}

}  // namespace

at::Tensor GroupedExperts::activation(const at::Tensor& h) const { return swiglu(h, swiglu_fusion_); }

void GroupedExperts::discard_activation(const at::Tensor& act, const at::Tensor& fc2_out, const at::Tensor& fc1_out) const {
  if (!recompute_activation_ || !is_training()) return;
  tp::discard_output_until_backward(act, fc2_out, [fc1_out, fused = swiglu_fusion_] { return swiglu(fc1_out, fused); });
}

void GroupedExperts::pack_weights() {
  const at::NoGradGuard no_grad;
  for (std::vector<at::Tensor>* weights : {&fc1, &fc2}) {
    if (weights->empty() || tp::stacked_in_place(*weights).defined()) continue;
    const at::Tensor packed = at::stack(*weights);  // [E_local, out, in]
    for (size_t e = 0; e < weights->size(); ++e) (*weights)[e].set_data(packed[int64_t(e)]);
  }
}

at::Tensor GroupedExperts::forward(const at::Tensor& rows, const at::Tensor& counts) const {
  TORCH_CHECK(counts.numel() == int64_t(fc1.size()), "GroupedExperts: ", counts.numel(), " row counts for ", fc1.size(), " experts");
  if (fp8_fc1_) {
    const at::Tensor lengths = counts.to(at::kLong);
    return mlp(rows, lengths.cumsum(0).to(at::kInt),
               [&](const at::Tensor& x, const at::Tensor& ends) { return fp8_fc1_->forward(x, lengths, ends, fc1); },
               [&](const at::Tensor& x, const at::Tensor& ends) { return fp8_fc2_->forward(x, lengths, ends, fc2); });
  }
  if (grouped_gemm_ && rows.is_cuda()) return grouped(rows, counts);
  const at::Tensor host = counts.to(at::kCPU, at::kLong).contiguous();
  std::vector<at::Tensor> outputs;
  int64_t begin = 0;
  for (size_t e = 0; e < fc1.size(); ++e) {
    const int64_t n = host.data_ptr<int64_t>()[e];
    const at::Tensor x = rows.narrow(0, begin, n);  // [n_e, h]
    begin += n;
    const at::Tensor up = tp::linear(x, fc1[e]);  // [n_e, 2f/tp]
    const at::Tensor act = activation(up);        // [n_e, f/tp]
    outputs.push_back(tp::linear(act, fc2[e]));   // [n_e, h]
    discard_activation(act, outputs.back(), up);
  }
  if (outputs.empty()) return rows.narrow(0, 0, 0);
  return at::cat(outputs, 0);  // [N, h]
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y = x_e W_e^T for each expert's rows as one grouped GEMM, with the weights' gradients made
// by one grouped GEMM too, each expert's a contiguous [out, in] block of it. Where the experts'
// main_grads lie side by side (gradient-accumulation fusion), that block goes into them in one
// pass instead of E gradients each upcast and added by a hook.
struct GroupedLinear : torch::autograd::Function<GroupedLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& offs, at::TensorList weights) {
    // [E, out, in]: in place where the gradient buffer lays the experts side by side, else a copy.
    const at::Tensor w = tp::stacked(weights);
    ctx->save_for_backward({x, offs, w});
    ctx->saved_data["weights"] = weights.vec();  // the parameters themselves, to find their main_grads
    return at::_grouped_mm(x, w.transpose(1, 2), offs);  // [N, out]
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &offs = saved[1], &w = saved[2];
    const at::Tensor dy = grad[0].contiguous();                          // [N, out]
    variable_list out = {at::_grouped_mm(dy, w, offs), at::Tensor()};  // dx [N, in]
    const std::vector<at::Tensor> weights = ctx->saved_data["weights"].toTensorVector();
    // No .grad where the main_grads take the gradients: by the GEMM's own epilogue where it can
    // (sm_90), else from a bf16 [E, out, in] (groups along the rows) added in one pass.
    if (tp::add_grouped_weight_grads_to_main_grads(weights, dy, x, offs)) {
      out.resize(out.size() + weights.size());
      return out;
    }
    const at::Tensor dw = at::_grouped_mm(dy.t(), x, offs);  // [E, out, in]
    if (tp::add_to_stacked_main_grads(weights, dw)) {
      out.resize(out.size() + weights.size());
    } else {
      for (int64_t e = 0; e < dw.size(0); ++e) out.push_back(dw[e]);
    }
    return out;
  }
};

}  // namespace

at::Tensor GroupedExperts::mlp(const at::Tensor& rows, const at::Tensor& ends, const GroupedGemm& linear1,
                               const GroupedGemm& linear2) const {
  const at::Tensor up = linear1(rows, ends);            // [N, 2f/tp]
  const at::Tensor act = activation(up).contiguous();  // [N, f/tp]
  const at::Tensor out = linear2(act, ends);            // [N, h]
  discard_activation(act, out, up);
  return out;
}

at::Tensor GroupedExperts::grouped(const at::Tensor& rows, const at::Tensor& counts) const {
  // One kernel over all experts: the ends of each expert's rows, computed on the device (no wait
  // for the host). The weights as a TensorList, so autograd takes each for an input of its own.
  return mlp(rows, counts.cumsum(0).to(at::kInt),
             [&](const at::Tensor& x, const at::Tensor& ends) { return GroupedLinear::apply(x, ends, at::TensorList(fc1)); },
             [&](const at::Tensor& x, const at::Tensor& ends) { return GroupedLinear::apply(x, ends, at::TensorList(fc2)); });
}

}  // namespace megatron::moe
