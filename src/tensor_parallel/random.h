// The model-parallel random generator (Megatron's CUDA RNG tracker): dropout inside the
// tensor-parallel region (attention probabilities of this rank's heads; under sequence
// parallelism also the hidden dropout on this rank's tokens) draws from a generator seeded
// seed + 2718 + tp_rank, so TP ranks drop independently. Everything else draws from the default
// generators, seeded alike on every TP rank, so replicated activations stay identical.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace megatron::tp {

// The default generators' states: the CPU one, and the current CUDA device's where `cuda`.
struct DefaultGeneratorStates {
  at::Tensor cpu, cuda;  // cuda undefined: left alone
  static DefaultGeneratorStates save(bool cuda);
  void restore() const;  // makes them the default generators' states
};

class RngTracker {
 public:
  RngTracker(uint64_t seed, int tp_rank, bool cuda);

  // Runs `draw` with the default CPU (and current CUDA) generator switched to this tracker's
  // state, then switches back.
  at::Tensor fork(const std::function<at::Tensor()>& draw);

  // Checkpointed with the other generator states.
  at::Tensor cpu_state() const { return cpu_state_; }
  at::Tensor cuda_state() const { return cuda_state_; }  // undefined without CUDA
  void set_states(const at::Tensor& cpu, const at::Tensor& cuda);

 private:
  at::Tensor cpu_state_;
  at::Tensor cuda_state_;
};

}  // namespace megatron::tp
