#include "moe/moe_layer.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>

#include "core/streams.h"
#include "tensor_parallel/mappings.h"
#include "tensor_parallel/recompute.h"

namespace megatron::moe {

MoELayer::MoELayer(const PartContext& ctx)
    : dispatcher_(ctx.config, ctx.tp.experts),
      tp_(ctx.tp),
      overlap_shared_(ctx.config.moe_shared_expert_overlap),
      recompute_shared_(ctx.config.selectively_recomputes("shared_experts")) {
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

at::Tensor MoELayer::shared_output(const at::Tensor& normed) const {
  auto run = [this](const at::Tensor& in) {
    at::Tensor shared = shared_experts->forward(in);  // [s, b, h]
    if (shared_gate_weight.defined()) shared = shared * at::sigmoid(at::linear(in, shared_gate_weight));
    return shared;
  };
  if (!recompute_shared_ || !is_training() || !at::GradMode::is_enabled()) return run(normed);
  // Megatron's --recompute-modules shared_experts: only the input is kept; the shared experts'
  // activations are made again in backward (the region outlives this call: `run` by value).
  return tp::recompute_in_backward([run](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{run(in[0])}; },
                                   {normed}, tp_, /*draws_random=*/false)[0];
}

at::Tensor MoELayer::forward(const at::Tensor& normed) {
  const int64_t s = normed.size(0), b = normed.size(1), h = normed.size(2);
  // --moe-shared-expert-overlap: the shared experts start first, on a stream of their own, and
  // run beside the router, the dispatch's communication and the routed experts; their backward
  // runs there too (autograd runs each op's backward on the stream of its forward).
  at::Tensor shared;
  std::optional<c10::Stream> side;
  if (shared_experts && overlap_shared_ && normed.is_cuda()) {
    const c10::Stream main = current_stream(normed.device());
    side = pooled_stream(normed.device(), /*high_priority=*/false);
    order_after(main, *side);
    // normed's memory is not reused until the side stream is done reading it.
    c10::impl::getDeviceGuardImpl(normed.device().type())->recordDataPtrOnStream(normed.storage().data_ptr(), *side);
    c10::StreamGuard on_side(*side);
    shared = shared_output(normed);
  }
  const at::Tensor local = normed.reshape({s * b, h});  // [s b, h] this rank's tokens (its sequence shard under SP)
  Routing routing = router->forward(local, b);
  at::Tensor tokens = local;
  // The experts are split over the expert-TP ranks (by default the TP ranks, which hold the
  // other shards of the same sequences): each of them sees all their tokens and routing.
  const dist::Group& etp = tp_.expert_group;
  if (etp.size() > 1) {
    tokens = tp::gather_from_sp(local, etp);                 // [etp s b, h]
    routing.probs = tp::gather_from_sp(routing.probs, etp);  // [etp s b, k]; partial gradients summed back
    routing.indices = tp::all_gather_rows(routing.indices, etp);
    if (routing.kept.defined()) routing.kept = tp::all_gather_rows(routing.kept, etp);
    routing.padded_capacity *= etp.size();  // each rank's tokens bring their own capacity's worth
  }
  const Dispatched dispatched = dispatcher_.dispatch(tokens, routing);
  at::Tensor out = dispatcher_.combine(experts->forward(dispatched.rows, dispatched.counts));  // [etp s b, h] partial over expert TP
  if (etp.size() > 1) out = tp::reduce_scatter_to_sp(out, etp);                             // [s b, h]
  out = out.view({s, b, h});
  if (side) {
    const c10::Stream main = current_stream(normed.device());
    order_after(*side, main);
    c10::impl::getDeviceGuardImpl(shared.device().type())->recordDataPtrOnStream(shared.storage().data_ptr(), main);
  } else if (shared_experts) {
    shared = shared_output(normed);
  }
  return shared.defined() ? out + shared : out;
}

}  // namespace megatron::moe
