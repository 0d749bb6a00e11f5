// Megatron's --cpu-offloading / --cpu-offloading-num-layers N: the activations the first N decoder
// layers save for their backward go to host memory during the forward and come back during the
// backward, so the device holds about two of those layers' activations at a time.
//
// How it hooks in: whenever autograd saves a tensor for backward (a SavedVariable), LibTorch asks
// the autograd engine for default saved-tensor hooks (what Python's
// torch.autograd.graph.saved_tensors_hooks sets). The engine this file installs before main, for
// the whole process (as PyTorch's Python engine installs itself at import; LibTorch's engine is a
// process-wide singleton by design), returns an offloading hook while an offload scope of the
// calling thread is open, and none otherwise, so every other SavedVariable is made as before.
//
// Per layer (a group): the tensors saved inside the scope are gathered by their storage (q, k and
// v viewing one buffer are copied once); after the layer's forward the copies of the group's
// storages to pinned host memory are queued on a stream of their own; after the next layer's
// forward the compute stream waits for them and the device storages are dropped, so later
// allocations reuse that memory in stream order. In the backward, when the gradient reaches the
// output of the layer after a group (that layer's backward begins), the group's storages are
// copied back on another stream; the group's first unpacked tensor makes the compute stream wait
// for them. Kept on the device as they are: parameters (leaves that require a gradient, and views
// of them), tensors of fewer than `min_elements` elements, tensors on another device than the
// model's, and storages registered with keep_on_device (the RoPE tables every layer reads).
//
// On the CPU the same bookkeeping runs with host copies and no streams: the unpacked tensors are
// views of copies, which the tests use to check that nothing is lost or mixed up.
#pragma once

#include <ATen/core/Tensor.h>

#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_set>

namespace megatron {

class ActivationOffloader {
 public:
  struct Group;  // one layer's saved storages (activation_offload.cpp)

  // Offloads the layers with index < num_layers (indices as passed to scope()) on `device`.
  ActivationOffloader(int64_t num_layers, const at::Device& device, int64_t min_elements = int64_t(1) << 20);
  ~ActivationOffloader();
  ActivationOffloader(const ActivationOffloader&) = delete;
  ActivationOffloader& operator=(const ActivationOffloader&) = delete;

  bool offloads(int64_t layer) const { return layer >= 0 && layer < num_layers_; }

  // While a Scope lives, the tensors the calling thread's autograd saves go to `layer`'s group.
  // A layer that is not offloaded gets an inactive scope.
  class Scope {
   public:
    Scope() = default;
    Scope(Scope&& other) noexcept;
    Scope& operator=(Scope&&) = delete;
    ~Scope();

   private:
    friend class ActivationOffloader;
    std::shared_ptr<Group> previous_;  // the thread's enclosing group, put back at the end
    bool active_ = false;
  };
  Scope scope(int64_t layer);

  // After layer `layer`'s forward, with its output (a tensor whose gradient arrives when that
  // layer's backward begins): queues the copies of `layer`'s group to the host, drops the device
  // storages of the group before it once their copies are done (in stream order), and makes the
  // group before it come back when the gradient reaches `output`.
  void after_layer(int64_t layer, const at::Tensor& output);
  // After the last layer's forward: every group still holding device storages drops them.
  void finish_forward();

  // The storage of `t` (a buffer every layer reads) is never offloaded.
  void keep_on_device(const at::Tensor& t);

  // What the last finished forward moved: tensors offloaded, the distinct storages they view, and
  // those storages' bytes (each counted once).
  struct Counts {
    int64_t tensors = 0, storages = 0, bytes = 0;
  };
  Counts last_forward() const { return last_counts_; }

 private:
  friend class OffloadHook;
  void release(Group& group);

  int64_t num_layers_;
  at::Device device_;
  int64_t min_elements_;
  // CUDA: one stream for every copy to the host and one for every copy back, so each direction's
  // copies queue behind each other and the two directions overlap.
  std::optional<c10::Stream> to_host_stream_, to_device_stream_;
  std::unordered_set<const void*> kept_;  // StorageImpl addresses
  std::shared_ptr<Group> open_;           // the group whose scope is open
  // The group closed after the previous layer: its device storages go once the next layer has run,
  // and it comes back when that layer's backward begins.
  std::shared_ptr<Group> previous_;
  Counts counts_, last_counts_;
};

}  // namespace megatron
