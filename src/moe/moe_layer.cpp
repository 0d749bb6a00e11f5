#include "moe/moe_layer.h"

#include <ATen/ATen.h>

#include "tensor_parallel/mappings.h"

namespace megatron::moe {

MoELayer::MoELayer(const PartContext& ctx) : dispatcher_(ctx.config, ctx.tp.experts), tp_(ctx.tp) {
  const ModelConfig& c = ctx.config;
  router = register_module("router", std::make_shared<TopKRouter>(ctx));
  experts = register_module("experts", std::make_shared<GroupedExperts>(ctx, dispatcher_.first_expert(), dispatcher_.local_experts()));
  if (c.moe_shared_expert_intermediate_size > 0) {
    PartContext shared = ctx;
    shared.norm_in_linear = false;  // the layer's pre_mlp_layernorm feeds the experts and the shared experts alike
    shared_experts = register_module("shared_experts", std::make_shared<MLP>(shared, c.moe_shared_expert_intermediate_size));
    if (c.moe_shared_expert_gate) {
      shared_gate_weight = shared_experts->add_parameter("gate_weight", at::empty({1, c.hidden_size}, at::TensorOptions().device(ctx.device)),
                                                         tp::sequence_sharded_replica(ctx.tp, tp::Init::Normal));
    }
  }
}

at::Tensor MoELayer::forward(const at::Tensor& normed) {
  const int64_t s = normed.size(0), b = normed.size(1), h = normed.size(2);
  const at::Tensor local = normed.reshape({s * b, h});  // [s b, h] this rank's tokens
  Routing routing = router->forward(local, b);
  at::Tensor tokens = local;
  if (tp_.size() > 1) {  // the whole sequence on every TP rank; each routed its own shard
    tokens = tp::gather_from_sp(local, tp_.group);                 // [tp s b, h]
    routing.probs = tp::gather_from_sp(routing.probs, tp_.group);  // [tp s b, k]; partial gradients summed back
    routing.indices = tp::all_gather_rows(routing.indices, tp_.group);
    if (routing.kept.defined()) routing.kept = tp::all_gather_rows(routing.kept, tp_.group);
  }
  const Dispatched dispatched = dispatcher_.dispatch(tokens, routing);
  at::Tensor out = dispatcher_.combine(experts->forward(dispatched.rows, dispatched.counts));  // [tp s b, h] partial over TP
  if (tp_.size() > 1) out = tp::reduce_scatter_to_sp(out, tp_.group);                        // [s b, h]
  out = out.view({s, b, h});
  if (shared_experts) {
    at::Tensor shared = shared_experts->forward(normed);  // [s, b, h]
    if (shared_gate_weight.defined()) shared = shared * at::sigmoid(at::linear(normed, shared_gate_weight));
    out = out + shared;
  }
  return out;
}

}  // namespace megatron::moe
