// The training loop: build the model and optimizer, resume, then iterate micro-batches ->
// forward/backward -> clip -> AdamW step, with Megatron's logging, validation, checkpoints,
// --exit-interval and graceful SIGTERM/SIGINT (finish the step, save, exit 0).
#pragma once

#include "core/config.h"

namespace megatron {

// Returns the process exit status.
int run_training(const Config& config);

}  // namespace megatron
