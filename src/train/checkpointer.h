// The trainer's checkpoints: saves at the intervals, on a signal and at the end, synchronous or
// asynchronous (--async-save: host copies taken in a short stall, files written on a thread
// while training goes on, published once every rank has written), one save per iteration.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "distributed/parallel_state.h"

namespace megatron {

class AdamW;
class GPTModel;

class Checkpointer {
 public:
  using Duration = std::chrono::steady_clock::duration;

  Checkpointer(const Config& config, const dist::ParallelState& ps, const at::Device& device);
  ~Checkpointer();  // waits for a writer still running (its error is dropped: the run is ending anyway)
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Saves `progress` into --save unless that iteration is saved already (collective). `why`
  // goes into the message. Returns how long training stood still, to keep out of the step time.
  Duration save(const TrainingProgress& progress, const std::vector<GPTModel*>& chunks, const AdamW& optimizer,
                const char* why);
  // --async-save: publishes the save in flight once every rank has written it (polled without
  // blocking), or with `wait` waits for it. Returns the time spent.
  Duration finish_async(bool wait);
  // The iteration a checkpoint was loaded at: saving it again would write the same state.
  void loaded(int64_t iteration) { last_saved_ = iteration; }
  bool saved(int64_t iteration) const { return last_saved_ == iteration; }

 private:
  struct AsyncSave {
    CheckpointSnapshot snapshot;
    std::thread writer;
    std::atomic<bool> done{false};
    std::exception_ptr error;
    std::chrono::steady_clock::time_point start;
    std::string why;
  };
  const Config& c_;
  const dist::ParallelState& ps_;
  at::Device device_;
  int64_t last_saved_ = -1;
  std::unique_ptr<AsyncSave> async_save_;
  std::map<std::string, at::Tensor> snapshot_buffers_;  // page-locked host copies, reused by every async save
};

}  // namespace megatron
