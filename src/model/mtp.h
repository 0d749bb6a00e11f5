// Multi-token prediction (DeepSeek-V3; Megatron-Core's MultiTokenPredictionBlock,
// --mtp-num-layers D): after the decoder, depth k = 1..D predicts the token k + 1 positions
// ahead. Each depth joins the embeddings of the tokens k positions ahead with the previous
// depth's hidden states (the decoder's, final-normed, for k = 1):
//
//   h_k = final_layernorm_k(transformer_layer_k(eh_proj_k([enorm_k(embed(tokens << k)) | hnorm_k(h_{k-1})])))
//
// and scores them with the model's own output layer against the labels k positions ahead (the
// shifted-in positions masked). The objective adds mtp_loss_scaling_factor / D x the sum of the
// depths' mean losses; each depth's mean is reported as "mtp_k loss" (Megatron's log names).
// The embedding and output layer are the model's: on the last pipeline stage a copy of the word
// embedding, kept equal as a tied one is. Parameters: mtp.layers.{k-1}.{enorm, hnorm, eh_proj,
// transformer_layer, final_layernorm} (Megatron's checkpoint names).
//
// Under context parallelism a rank holds two chunks of the sequence, and the tokens k positions
// ahead of a chunk's last ones lie in the next chunk, on another rank: the shifted tokens, labels
// and loss masks are cut from the whole micro-batch instead (add_context_parallel_shifts), and
// each depth's mean is over the tokens of every CP rank.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/micro_batch.h"
#include "model/layer_spec.h"
#include "model/norm_module.h"
#include "model/transformer_layer.h"

namespace megatron {

// What the depths borrow from the model.
struct MtpModelParts {
  std::function<at::Tensor(const at::Tensor& tokens)> embed;           // [b, s] -> [s(/tp), b, h]
  std::function<at::Tensor(const at::Tensor& normed)> logits;          // [s(/tp), b, h] -> [s, b, V/tp]
  std::function<at::Tensor(const at::Tensor& logits, const at::Tensor& labels)> token_losses;  // -> [b, s] fp32
  const RopeTables* rope = nullptr;
  at::Tensor attention_mask;
};

class MtpLayer : public tp::DescribedModule {
 public:
  MtpLayer(const ModelConfig& config, const tp::TensorParallel& tp, const LayerSpec& spec, at::Device device);
  // hidden, embedded: [s(/tp), b, h] -> this depth's final-normed hidden states, the same shape.
  at::Tensor forward(const at::Tensor& hidden, const at::Tensor& embedded, const RopeTables* rope, const at::Tensor& attention_mask);

  std::shared_ptr<NormModule> enorm, hnorm, final_layernorm;
  std::shared_ptr<tp::ColumnParallelLinear> eh_proj;  // [h / tp, 2h]
  std::shared_ptr<TransformerLayer> transformer_layer;

 private:
  tp::TensorParallel tp_;
};

class MultiTokenPrediction : public tp::DescribedModule {
 public:
  MultiTokenPrediction(const ModelConfig& config, const tp::TensorParallel& tp, const LayerSpec& spec, at::Device device);

  // hidden: the decoder's final-normed output [s(/tp), b, h]. Returns the term the objective
  // adds ([] fp32: scaling / D x the sum of the depths' mean losses) and keeps each depth's mean
  // for take_tracked.
  at::Tensor loss(const at::Tensor& hidden, const Batch& batch, const MtpModelParts& parts);
  // The depths' mean losses of the forwards since the last call, each times `scale` ([D] fp32),
  // or undefined.
  at::Tensor take_tracked();
  void set_tracked_scale(double scale) { tracked_scale_ = scale; }

  std::vector<std::shared_ptr<MtpLayer>> layers;

 private:
  double scaling_factor_;
  dist::Group context_;  // the CP peers: a depth's mean counts their loss tokens too
  double tracked_scale_ = 1.0;
  at::Tensor tracked_;  // [D]
};

// Context parallelism: rank `rank`'s rows of the whole micro-batch's tokens, labels and loss mask
// shifted left by k = 1 .. depths, as extra fields of its batch that MultiTokenPrediction::loss
// reads instead of shifting the rank's own rows.
void add_context_parallel_shifts(Batch& rank_batch, const Batch& whole, int depths, int cp, int rank);

// "mtp_1 loss", ... for a model with --mtp-num-layers (none without).
std::vector<std::string> mtp_loss_names(const ModelConfig& config);

}  // namespace megatron
