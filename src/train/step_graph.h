// One training step recorded as a CUDA graph and replayed (--cuda-graph-impl local
// --cuda-graph-scope full_iteration). A step at the 1.1B reference shape launches about 1,300
// kernels; replaying them as one graph removes the host's launch work. That pays where steps are
// short enough for the host to fall behind; at the 1.1B shape on an H200 the GPU was already kept
// busy and replaying gained 0.15% (docs/performance.md).
//
// What the captured work may do, and what the trainer provides for it:
// - It must not wait for the host (no .item(), no host copies): the trainer's step enqueues
//   device work only, and the learning rate is a device value (AdamW::set_learning_rate).
// - Every tensor it reads must stay at the same address: parameters, gradient buffer and
//   optimizer state do; each iteration's batch is copied into the graph's input tensors.
// - Tensors it allocates come from the graph's private memory pool and are rewritten by every
//   replay (the step's loss and gradient norm among them).
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <memory>

namespace megatron {

class StepGraph {
 public:
  // Makes a stream of its own current on the calling thread for the object's lifetime: capture
  // needs a stream other than the default one, and the eager warm-up steps run on it too, so that
  // cuBLAS's workspace for it exists before capture starts. Throws UserError unless this is a CUDA
  // build running on a CUDA device.
  explicit StepGraph(const at::Device& device);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  bool captured() const;
  // Runs `enqueue` with the stream capturing: the work it enqueues is recorded, not run (replay()
  // runs it). Returns the number of nodes (kernels, copies, event records) in the graph.
  size_t capture(const std::function<void()>& enqueue);
  void replay();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace megatron
