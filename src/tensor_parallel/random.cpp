#include "tensor_parallel/random.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace megatron::tp {
namespace {

constexpr uint64_t kModelParallelSeedOffset = 2718;  // Megatron's

at::Generator cuda_generator() { return at::globalContext().defaultGenerator(at::Device(at::kCUDA)); }

}  // namespace

RngTracker::RngTracker(uint64_t seed, int tp_rank, bool cuda) {
  const uint64_t mp_seed = seed + kModelParallelSeedOffset + uint64_t(tp_rank);
  cpu_state_ = at::make_generator<at::CPUGeneratorImpl>(mp_seed).get_state();
  if (cuda) {
    at::Generator g = cuda_generator();
    at::Tensor saved = g.get_state();
    g.set_current_seed(mp_seed);
    cuda_state_ = g.get_state();
    g.set_state(saved);
  }
}

at::Tensor RngTracker::fork(const std::function<at::Tensor()>& draw) {
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  at::Tensor cpu_saved = cpu.get_state();
  cpu.set_state(cpu_state_);
  at::Tensor cuda_saved;
  if (cuda_state_.defined()) {
    at::Generator g = cuda_generator();
    cuda_saved = g.get_state();
    g.set_state(cuda_state_);
  }
  at::Tensor out = draw();
  cpu_state_ = cpu.get_state();
  cpu.set_state(cpu_saved);
  if (cuda_state_.defined()) {
    at::Generator g = cuda_generator();
    cuda_state_ = g.get_state();
    g.set_state(cuda_saved);
  }
  return out;
}

void RngTracker::set_states(const at::Tensor& cpu, const at::Tensor& cuda) {
  cpu_state_ = cpu.clone();
  if (cuda.defined() && cuda_state_.defined()) cuda_state_ = cuda.clone();
}

}  // namespace megatron::tp
