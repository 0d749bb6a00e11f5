// The training loop: join the job's process groups, build this rank's model shard and the
// optimizer, resume, then iterate micro-batches -> forward/backward (gradients reduced over
// data-parallel replicas in buckets) -> clip -> AdamW step, with Megatron's logging,
// validation, checkpoints, --exit-interval and graceful SIGTERM/SIGINT (finish the step, save,
// exit 0; all ranks agree on the step).
#pragma once

#include "core/config.h"
#include "distributed/launch_env.h"

namespace megatron {

// What a run does once the model is built and the checkpoint loaded: train (`megatron train`), or
// only evaluate the weights on the validation and test splits and exit (`megatron eval`).
enum class RunMode { Train, Evaluate };

// `config` must be finalized for env.world_size. Returns the process exit status.
int run_training(const Config& config, const dist::LaunchEnv& env = {}, RunMode mode = RunMode::Train);

}  // namespace megatron
