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

DefaultGeneratorStates DefaultGeneratorStates::save(bool cuda) {
  DefaultGeneratorStates s;
  s.cpu = at::detail::getDefaultCPUGenerator().get_state();
  if (cuda) s.cuda = cuda_generator().get_state();
  return s;
}

void DefaultGeneratorStates::restore() const {
  at::Generator default_cpu = at::detail::getDefaultCPUGenerator();
  default_cpu.set_state(cpu);
  if (cuda.defined()) {
    at::Generator default_cuda = cuda_generator();
    default_cuda.set_state(cuda);
  }
}

at::Tensor RngTracker::fork(const std::function<at::Tensor()>& draw) {
  const bool cuda = cuda_state_.defined();
  const DefaultGeneratorStates outside = DefaultGeneratorStates::save(cuda);
  DefaultGeneratorStates{cpu_state_, cuda_state_}.restore();
  at::Tensor out = draw();
  const DefaultGeneratorStates inside = DefaultGeneratorStates::save(cuda);
  cpu_state_ = inside.cpu;
  cuda_state_ = inside.cuda;
  outside.restore();
  return out;
}

void RngTracker::set_states(const at::Tensor& cpu, const at::Tensor& cuda) {
  cpu_state_ = cpu.clone();
  if (cuda.defined() && cuda_state_.defined()) cuda_state_ = cuda.clone();
}

}  // namespace megatron::tp
