#include "model/loss.h"

#include <ATen/ATen.h>

namespace megatron {

MicroBatchLoss masked_token_mean(const at::Tensor& token_losses, const Batch& batch) {
  const at::Tensor mask = batch.loss_mask.to(token_losses.scalar_type());
  const at::Tensor tokens = mask.sum();
  return {(token_losses * mask).sum() / tokens.clamp_min(1.0), {}, tokens};
}

}  // namespace megatron
