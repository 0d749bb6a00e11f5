// The loss of one micro-batch, from the per-token losses of the chunk that ends the model, as
// the model's family defines it (Megatron-Core's forward_step hands its output to a loss_func):
// the loss backward starts from, and named terms reported next to "lm loss" in the log line
// (an MoE balancing loss, an MTP loss, a z-loss, ...).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>

#include "data/micro_batch.h"

namespace megatron {

struct MicroBatchLoss {
  at::Tensor loss;                          // [] what backward starts from (the trainer divides it by the micro-batch count)
  std::map<std::string, at::Tensor> terms;  // [] each, by the names the family declares; averaged as the loss is
};

// token_losses: [b, s] fp32 cross entropy of each position.
using LossFunction = std::function<MicroBatchLoss(const at::Tensor& token_losses, const Batch& batch)>;

// The language-model loss: the mean over the tokens batch.loss_mask selects, no terms.
MicroBatchLoss masked_token_mean(const at::Tensor& token_losses, const Batch& batch);

}  // namespace megatron
