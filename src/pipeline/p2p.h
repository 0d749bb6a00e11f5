// Activations and their gradients between neighbouring pipeline stages. Shapes are known ahead
// ([s(/tp), b, h] in the activation dtype), so only tensors travel. All transfers of one
// exchange are posted asynchronously in an order that pairs up between neighbours (even stages
// send first, odd stages receive first), then waited for: no deadlock on Gloo or NCCL, and
// with two stages, where "next" and "previous" are the same peer, activations and gradients
// still meet their matching receives.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "distributed/process_group.h"

namespace megatron::pipeline {

class StageLink {
 public:
  StageLink(const dist::Group& pp, std::vector<int64_t> shape, at::TensorOptions options);

  struct Received {
    at::Tensor from_prev;  // an activation from the previous stage
    at::Tensor from_next;  // a gradient from the next stage
  };
  // Sends the defined tensors (an activation to the next stage, a gradient to the previous one)
  // and receives where asked. Stages wrap around (the last stage's next is the first), as the
  // interleaved schedule needs.
  Received exchange(const at::Tensor& to_next, const at::Tensor& to_prev, bool recv_prev, bool recv_next) const;

 private:
  dist::Group pp_;
  std::vector<int64_t> shape_;
  at::TensorOptions options_;
};

}  // namespace megatron::pipeline
