#include "model/mtp.h"

#include <ATen/ATen.h>

#include "context_parallel/chunks.h"
#include "tensor_parallel/mappings.h"

namespace megatron {
namespace {

// x [b, s] shifted left by `k` positions, the last k filled with zeros (Megatron's roll_tensor,
// applied k times).
at::Tensor shift_left(const at::Tensor& x, int64_t k) {
  const int64_t s = x.size(1);
  if (k >= s) return at::zeros_like(x);
  return at::cat({x.narrow(1, k, s - k), at::zeros({x.size(0), k}, x.options())}, 1);
}

// The extra field of a batch holding `what` shifted left by k under context parallelism.
std::string shifted_field(const char* what, int64_t k) { return std::string("mtp ") + what + " shifted " + std::to_string(k); }

}  // namespace

void add_context_parallel_shifts(Batch& rank_batch, const Batch& whole, int depths, int cp, int rank) {
  for (int k = 1; k <= depths; ++k) {
    rank_batch.extra[shifted_field("tokens", k)] = cp::rank_rows(shift_left(whole.tokens, k), 1, cp, rank);
    rank_batch.extra[shifted_field("labels", k)] = cp::rank_rows(shift_left(whole.labels, k), 1, cp, rank);
    rank_batch.extra[shifted_field("loss mask", k)] = cp::rank_rows(shift_left(whole.loss_mask, k), 1, cp, rank);
  }
}

MtpLayer::MtpLayer(const ModelConfig& c, const tp::TensorParallel& tp, const LayerSpec& spec, at::Device device) : tp_(tp) {
  enorm = register_module("enorm", std::make_shared<NormModule>(c, tp, device));
  hnorm = register_module("hnorm", std::make_shared<NormModule>(c, tp, device));
  eh_proj = register_module("eh_proj", std::make_shared<tp::ColumnParallelLinear>(2 * int64_t(c.hidden_size), c.hidden_size, false, tp,
                                                                                 tp::LinearOptions{device, tp::Init::Normal, false}));
  // Built as the decoder's last layer (Megatron's MTP block spec: an MoE layer for DeepSeek-V3).
  transformer_layer = register_module("transformer_layer", std::make_shared<TransformerLayer>(c, tp, spec, device, c.num_layers - 1));
  final_layernorm = register_module("final_layernorm", std::make_shared<NormModule>(c, tp, device));
}

at::Tensor MtpLayer::forward(const at::Tensor& hidden, const at::Tensor& embedded, const RopeTables* rope,
                             const at::Tensor& attention_mask) {
  // [embedding | hidden] -> h: column-parallel, its output gathered whole and, under sequence
  // parallelism, back to this rank's sequence shard.
  const at::Tensor joined = at::cat({enorm->params().apply(embedded), hnorm->params().apply(hidden)}, -1);  // [s(/tp), b, 2h]
  at::Tensor h = tp::gather_from_tp(eh_proj->forward(joined), tp_.group);  // [s, b, h]
  if (tp_.sequence_parallel) h = tp::scatter_to_sp(h, tp_.group);        // [s/tp, b, h]
  return final_layernorm->params().apply(transformer_layer->forward(h, rope, attention_mask));
}

MultiTokenPrediction::MultiTokenPrediction(const ModelConfig& c, const tp::TensorParallel& tp, const LayerSpec& spec,
                                           at::Device device)
    : scaling_factor_(c.mtp_loss_scaling_factor), context_(tp.context) {
  auto holder = register_module("layers", std::make_shared<tp::DescribedModule>());
  for (int k = 0; k < c.mtp_num_layers; ++k) {
    layers.push_back(holder->register_module(std::to_string(k), std::make_shared<MtpLayer>(c, tp, spec, device)));
  }
}

at::Tensor MultiTokenPrediction::loss(const at::Tensor& hidden, const Batch& batch, const MtpModelParts& parts) {
  const int64_t depths = int64_t(layers.size());
  at::Tensor h = hidden, total;
  std::vector<at::Tensor> depth_means;
  // x shifted left by k: this rank's rows cut from the whole batch's under CP, else shifted here.
  auto shifted = [&](const char* what, const at::Tensor& x, int64_t k) {
    const auto it = batch.extra.find(shifted_field(what, k));
    return it != batch.extra.end() ? it->second : shift_left(x, k);
  };
  for (int64_t k = 1; k <= depths; ++k) {
    h = layers[size_t(k - 1)]->forward(h, parts.embed(shifted("tokens", batch.tokens, k)), parts.rope, parts.attention_mask);
    const at::Tensor mask = shifted("loss mask", batch.loss_mask, k).to(at::kFloat);                        // [b, s]
    const at::Tensor losses = parts.token_losses(parts.logits(h), shifted("labels", batch.labels, k));      // [b, s]
    at::Tensor tokens = mask.sum().reshape({1});
    if (context_.size() > 1) context_.all_reduce(tokens);  // every CP rank's share of the mean (scaled by CP with the loss)
    const at::Tensor mean = (losses * mask.to(losses.device())).sum() / tokens.squeeze(0).clamp_min(1.0).to(losses.device());
    depth_means.push_back(mean.detach().to(at::kFloat));
    total = total.defined() ? total + mean : mean;
  }
  const at::Tensor values = at::stack(depth_means) * tracked_scale_;
  tracked_ = tracked_.defined() ? tracked_ + values : values;
  return total * (scaling_factor_ / double(depths));
}

at::Tensor MultiTokenPrediction::take_tracked() {
  at::Tensor out = tracked_;
  tracked_ = at::Tensor();
  return out;
}

std::vector<std::string> mtp_loss_names(const ModelConfig& c) {
  std::vector<std::string> names;
  for (int k = 1; k <= c.mtp_num_layers; ++k) names.push_back("mtp_" + std::to_string(k) + " loss");
  return names;
}

}  // namespace megatron
