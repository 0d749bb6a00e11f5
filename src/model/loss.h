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
  at::Tensor loss;                          // [] the mean over the micro-batch's loss tokens (the trainer scales it, see below)
  std::map<std::string, at::Tensor> terms;  // [] each, by the names the family declares; averaged as the loss is
  // [] how many tokens `loss` averages over. The trainer divides the loss by the micro-batch count
  // before backward, or with --calculate-per-token-loss multiplies it by this (a sum over tokens)
  // and divides the gradients by the global batch's count.
  at::Tensor tokens;
};

// token_losses: [b, s] fp32 cross entropy of each position.
using LossFunction = std::function<MicroBatchLoss(const at::Tensor& token_losses, const Batch& batch)>;

// The language-model loss: the mean over the tokens batch.loss_mask selects, no terms.
MicroBatchLoss masked_token_mean(const at::Tensor& token_losses, const Batch& batch);

}  // namespace megatron
