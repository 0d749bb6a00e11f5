// `--save-hf` at the end of training under any layout: the whole model gathered tensor by tensor
// (over TP on the stage that holds it, then to rank 0 over the pipeline group) and written by
// rank 0 as a Hugging Face model directory (hf_export.h). Collective over DP replica 0; the
// other replicas wait at the final barrier.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "core/config.h"
#include "distributed/parallel_state.h"

namespace megatron {

class GPTModel;

// `chunks`: this rank's model chunks, parameters current (all-gathered).
void export_hf_from_ranks(const std::vector<GPTModel*>& chunks, const Config& config, const dist::ParallelState& ps,
                          const at::Device& device);

}  // namespace megatron
