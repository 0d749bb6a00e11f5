#include "model/loss.h"

#include <ATen/ATen.h>

namespace megatron {

MicroBatchLoss masked_token_mean(const at::Tensor& token_losses, const Batch& batch) {
  const at::Tensor mask = batch.loss_mask.to(token_losses.scalar_type());
  return {(token_losses * mask).sum() / mask.sum().clamp_min(1.0), {}};
}

}  // namespace megatron
