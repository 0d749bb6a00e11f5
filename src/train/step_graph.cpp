#include "train/step_graph.h"

#include "core/errors.h"

#ifdef MEGATRON_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#endif

namespace megatron {

#ifdef MEGATRON_WITH_CUDA_KERNELS

struct StepGraph::State {
  explicit State(c10::cuda::CUDAStream s) : stream(s), current(s) {}
  // The stream does not order itself after the default one: what ran there (initialisation,
  // checkpoint loading) is finished first, and what runs there afterwards waits for this one.
  ~State() {
    try {
      stream.synchronize();
    } catch (...) {  // a destructor must not throw; an error here was reported by the failing call
    }
  }
  c10::cuda::CUDAStream stream;
  c10::cuda::CUDAStreamGuard current;
  at::cuda::CUDAGraph graph{/*keep_graph=*/true};  // kept until instantiated, to count its nodes
  bool captured = false;
};

StepGraph::StepGraph(const at::Device& device) {
  if (!device.is_cuda()) {
    throw UserError("--cuda-graph-impl local needs a CUDA device; this run is on " + device.str());
  }
  c10::cuda::device_synchronize();  // see State
  state_ = std::make_unique<State>(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index()));
}

StepGraph::~StepGraph() = default;

bool StepGraph::captured() const { return state_->captured; }

size_t StepGraph::capture(const std::function<void()>& enqueue) {
  // The warm-up steps' cached blocks go back to the device: the graph allocates from a pool of
  // its own, and would otherwise hold a second copy of the activations' memory.
  c10::cuda::CUDACachingAllocator::emptyCache();
  // Thread-local mode bars only this thread from calls that are unsafe while capturing. The
  // autograd engine's device thread launches the backward kernels into the capturing stream (they
  // are recorded as well), and the prefetcher's thread goes on pinning batches meanwhile.
  state_->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
  try {
    enqueue();
    state_->graph.capture_end();
  } catch (const std::exception& e) {
    try {
      state_->graph.capture_end();  // leave the stream usable; the capture is invalid anyway
    } catch (...) {
    }
    throw std::runtime_error(std::string("capturing the training step as a CUDA graph failed (run without "
                                         "--cuda-graph-impl to train eagerly): ") + e.what());
  }
  size_t nodes = 0;
  C10_CUDA_CHECK(cudaGraphGetNodes(state_->graph.raw_cuda_graph(), nullptr, &nodes));
  state_->graph.instantiate();
  state_->captured = true;
  return nodes;
}

void StepGraph::replay() { state_->graph.replay(); }

#else  // a build without CUDA

struct StepGraph::State {};

StepGraph::StepGraph(const at::Device&) {
  throw UserError("--cuda-graph-impl local: this build has no CUDA support (configure with -DMEGATRON_CUDA=ON)");
}
StepGraph::~StepGraph() = default;
bool StepGraph::captured() const { return false; }
size_t StepGraph::capture(const std::function<void()>&) { return 0; }
void StepGraph::replay() {}

#endif

}  // namespace megatron
