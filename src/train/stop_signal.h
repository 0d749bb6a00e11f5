// SIGTERM / SIGINT during training: the run stops after an iteration that every rank agrees on
// (and the caller saves a checkpoint first). One process reads the signal directly; several
// all-reduce it each iteration and act on the result of an earlier iteration, so the read never
// stalls the host on the step in flight.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <deque>
#include <optional>

#include "distributed/parallel_state.h"

namespace megatron {

class StopSignal {
 public:
  // Installs the handlers for SIGTERM and SIGINT.
  StopSignal(const dist::ParallelState& ps, const at::Device& device);
  // Each iteration, inside the step on multi-rank runs: this rank's signal all-reduced (max)
  // over the world, copied to host memory without waiting.
  void launch_poll();
  // Between iterations: whether to stop now (the same answer on every rank at the same
  // iteration; multi-rank runs see a signal kPollLag iterations after it arrived).
  bool requested();
  int signal() const;  // the signal seen, 0 if none

 private:
  struct Poll {
    at::Tensor host;                  // [1] fp32: the world's max signal, in host memory once ready
    std::optional<c10::Event> ready;  // recorded after the copy (GPU runs)
  };
  static constexpr size_t kPollLag = 2;
  const dist::ParallelState& ps_;
  at::Device device_;
  std::deque<Poll> polls_;
};

}  // namespace megatron
