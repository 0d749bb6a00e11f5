// The GPT model of Megatron-Core: vocab embedding -> decoder layers -> final norm -> output
// layer, activations [s, b, h]. Parameter names match Megatron-Core's
// (`embedding.word_embeddings.weight`, `decoder.layers.0.self_attention.linear_qkv.weight`, ...).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <functional>
#include <memory>
#include <optional>

#include "core/config.h"
#include "model/norm.h"
#include "model/rope.h"
#include "model/transformer_layer.h"
#include "tensor_parallel/layers.h"

namespace megatron {

// One micro-batch, batch-first as the data loader yields it.
struct Batch {
  at::Tensor tokens;          // [b, s] int64
  at::Tensor labels;          // [b, s] int64
  at::Tensor loss_mask;       // [b, s] float
  at::Tensor position_ids;    // [b, s] int64; undefined: 0..s-1 for every sample
  at::Tensor attention_mask;  // [b, 1, s, s] bool, true = may attend; undefined: plain causal
};

class GPTModel : public torch::nn::Module {
 public:
  // With tensor parallelism (tp.size() > 1) this process holds its TP rank's shard.
  explicit GPTModel(const ModelConfig& config, const tp::TensorParallel& tp = {});

  // Megatron's initialisation, drawn from `seed` in parameter order: normal(0, std) for weights,
  // std / sqrt(2 * num_layers) for the projections into the residual stream, ones / zeros for
  // norms and biases. Runs on CPU in fp32 so every device and dtype starts from the same values;
  // under TP every rank draws the full tensors and keeps its shard, so any layout starts from
  // the weights a single process would (Megatron's --use-cpu-initialization).
  void initialize(uint64_t seed);

  // tokens [b, s] -> logits [s, b, V/tp] (this rank's vocabulary slice) in the parameters' dtype. position_ids [b, s] and
  // attention_mask [b, 1, s, s] (true = attend) are optional, as in Batch.
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& position_ids = {},
                     const at::Tensor& attention_mask = {});

  // Per-token cross entropy (fp32), [b, s].
  at::Tensor token_losses(const Batch& batch);

  // Mean loss over the tokens the mask selects.
  at::Tensor loss(const Batch& batch);

  // Parameters of the whole model (all TP shards).
  int64_t num_parameters() const;
  const ModelConfig& config() const { return config_; }
  const tp::TensorParallel& tensor_parallel() const { return tp_; }

  at::Tensor word_embeddings;       // [V/tp, h]
  at::Tensor position_embeddings;   // [max_pos, h] (learned_absolute only)
  torch::nn::ModuleList layers;
  at::Tensor final_layernorm_weight;  // [h]
  at::Tensor final_layernorm_bias;    // [h] LayerNorm only
  at::Tensor output_layer_weight;     // [V/tp, h] when untied

  // Called in forward with the parameters the next part (embedding, a layer, the head) is
  // about to use, so an overlapped parameter all-gather need only have finished for those.
  std::function<void(const std::vector<at::Tensor>&)> before_use;

 private:
  const RopeTables* rope_for(int64_t seq_len, const at::Device& device);

  ModelConfig config_;
  tp::TensorParallel tp_;
  std::optional<RopeTables> rope_;
};

}  // namespace megatron
