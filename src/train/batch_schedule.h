// The global batch size of each iteration: --global-batch-size throughout, or Megatron's
// --step-batch-size-schedule "THRESHOLD:BS THRESHOLD:BS ...", where each batch size applies
// from its threshold of consumed tokens on (K, M, B, T suffixes; converted to samples by
// --seq-length, as megatron.training passes it), the first threshold 0.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"

namespace megatron {

class GlobalBatchSchedule {
 public:
  // UserError naming --step-batch-size-schedule on a malformed schedule.
  GlobalBatchSchedule(const TrainConfig& config, int64_t seq_length);

  // The global batch of the iteration that starts after `consumed_samples`.
  int64_t at(int64_t consumed_samples) const;
  // Iterations until `samples` are consumed (Megatron's update_train_iters: the last partial
  // batch is kept with a schedule, dropped without).
  int64_t iterations_for(int64_t samples) const;
  bool constant() const { return steps_.size() == 1; }
  // (threshold in samples, global batch), ascending.
  const std::vector<std::pair<int64_t, int64_t>>& steps() const { return steps_; }

 private:
  std::vector<std::pair<int64_t, int64_t>> steps_;
};

}  // namespace megatron
