// The gradient buffers of a rank's model chunks, as Megatron-Core's DDP builds them from the
// parallel flags: dense parameters in one buffer reduced over DP, MoE experts' in another
// reduced over expert-DP (tp::GradGroup says which), each bucketed and optionally sharded for
// the distributed optimizer.
#pragma once

#include <memory>
#include <vector>

#include "core/config.h"
#include "distributed/parallel_state.h"
#include "model/gpt_model.h"
#include "optim/grad_buffer.h"

namespace megatron {

struct GradBuffers {
  std::unique_ptr<ParamAndGradBuffer> dense;
  std::unique_ptr<ParamAndGradBuffer> experts;  // null without MoE experts
  std::vector<ParamAndGradBuffer*> all() const;  // dense, then experts
};

GradBuffers make_grad_buffers(const std::vector<GPTModel*>& chunks, const Config& config, const dist::ParallelState& ps,
                              bool on_cuda);

}  // namespace megatron
