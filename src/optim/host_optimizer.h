// --optimizer-cpu-offload (Megatron's HybridDeviceOptimizer): the optimizer state of the first
// --optimizer-offload-fraction of this rank's parameters (counted in elements, in registration
// order, as Megatron) lives in host memory and the CPU steps it. Per step the gradients come over
// from the device, the fused AdamW runs on the host (ATen's, multithreaded), and the updated
// weights go back, chunk by chunk through pinned staging buffers, so the device holds neither
// masters nor moments of those parameters. With --overlap-cpu-optimizer-d2h-h2d the copies run on
// streams of their own: the next chunk's gradients arrive while this one steps, and its weights
// leave while the next one steps. Without it each copy finishes before the CPU goes on.
//
// The masters kept on the host are plain fp32 (the precision-aware optimizer's bf16 + remainder
// form saves device memory, which these no longer use); the moments keep --exp-avg-dtype /
// --exp-avg-sq-dtype. Checkpoints are the same as without offloading.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "kernels/ops.h"

namespace megatron {

struct OptimizerParam;

class HostOptimizer {
 public:
  // Moves the chosen parameters' masters and moments to the host (OptimizerParam::on_host).
  // Throws UserError when the host has too little memory for them.
  // `chunk_elements`: the staging chunk (0: 2^25 elements, 128 MiB of fp32 gradients).
  // `report`: print where the second step's host time went (one rank does).
  HostOptimizer(std::vector<OptimizerParam>& params, const TrainConfig& config, int64_t chunk_elements = 0, bool report = false);

  bool empty() const { return chunks_.empty(); }
  int64_t offloaded_elements() const { return offloaded_elements_; }

  // One AdamW step of the offloaded parameters with the step's scalars (computed on the device;
  // read here once: the host must wait for the gradients anyway). When it returns the device's
  // current stream is ordered after the updated weights' copies.
  void step(std::vector<OptimizerParam>& params, const kernels::AdamWStepScalars& scalars,
            const kernels::AdamWStepScalars& decoupled, const TrainConfig& config);

 private:
  struct Chunk {
    size_t param;  // index into the optimizer's params
    int64_t offset, numel;
  };
  struct Slot {  // pinned staging for one chunk in flight
    at::Tensor grad, model;
    std::optional<c10::Event> gradient_arrived, weights_sent;
  };
  struct StepTimes {  // seconds of one step
    double backward = 0, gradients = 0, adamw = 0, staging = 0;
  };
  void run_step(std::vector<OptimizerParam>& params, const kernels::AdamWStepScalars& scalars,
                const kernels::AdamWStepScalars& decoupled, const TrainConfig& config, StepTimes& times);
  void step_chunk(OptimizerParam& p, const Chunk& c, const at::Tensor& grad, const at::Tensor& model,
                  const kernels::AdamWStepScalars& s, const TrainConfig& config) const;

  std::vector<Chunk> chunks_;
  std::vector<Slot> slots_;
  int64_t offloaded_elements_ = 0;
  bool overlap_ = false;
  std::optional<c10::Stream> d2h_, h2d_;
  bool report_ = false;
  int64_t steps_ = 0;
};

// Host memory a process may use now: MemAvailable of /proc/meminfo over the ranks on this node
// (the launch environment's local world size); -1 when unknown.
int64_t host_memory_available_per_rank();
// UserError when `needed` bytes exceed 90% of `available` (unknown: no check).
void check_host_memory(int64_t needed, int64_t available);

}  // namespace megatron
