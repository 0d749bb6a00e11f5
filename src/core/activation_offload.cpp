#include "core/activation_offload.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <mutex>
#include <optional>
#include <unordered_map>

#include "core/streams.h"

namespace megatron {

struct ActivationOffloader::Group {
  struct Stored {
    c10::Storage device;  // the original, held until the copy to the host is done (stream order)
    int64_t nbytes = 0;
    at::Tensor host;      // [nbytes] uint8; pinned on CUDA
    at::Tensor back;      // [nbytes] uint8 on the device again (on the CPU: the host copy itself)
  };
  ActivationOffloader* owner = nullptr;
  at::Device device = at::kCPU;
  std::vector<Stored> stored;
  std::unordered_map<const void*, size_t> position;  // StorageImpl address -> index into stored
  std::optional<c10::Stream> to_host_stream, to_device_stream;  // the offloader's (CUDA)
  std::optional<c10::Event> copied;    // the copies to the host (CUDA)
  std::optional<c10::Event> returned;  // the copies back (CUDA)
  bool released = false, reload_queued = false, waited = false;
  std::mutex mutex;  // the backward's engine thread reloads; a prefetch hook may race an unpack

  // The storage as a flat byte tensor on its device.
  static at::Tensor bytes_of(const c10::Storage& storage, int64_t nbytes, const at::Device& device) {
    at::Tensor bytes = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(device));
    bytes.set_(storage, 0, {nbytes}, {1});
    return bytes;
  }

  void queue_copies_to_host() {
    if (!device.is_cuda()) {
      for (Stored& s : stored) {
        s.back = s.host = bytes_of(s.device, s.nbytes, device).clone();
        s.device = {};
      }
      released = true;
      return;
    }
    const c10::Stream compute = current_stream(device);
    order_after(compute, *to_host_stream);
    {
      c10::StreamGuard guard(*to_host_stream);
      for (Stored& s : stored) {
        s.host = at::empty({s.nbytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
        s.host.copy_(bytes_of(s.device, s.nbytes, device), /*non_blocking=*/true);
      }
    }
    copied.emplace(device.type());
    copied->record(*to_host_stream);
  }

  // Brings the storages back; the caller holds `mutex`.
  void queue_copies_back() {
    reload_queued = true;
    if (!device.is_cuda()) return;  // `back` is the host copy already
    const c10::Stream compute = current_stream(device);
    for (Stored& s : stored) s.back = at::empty({s.nbytes}, at::TensorOptions().dtype(at::kByte).device(device));
    order_after(compute, *to_device_stream);  // the new buffers are free to be written
    {
      c10::StreamGuard guard(*to_device_stream);
      for (Stored& s : stored) {
        s.back.copy_(s.host, /*non_blocking=*/true);
        s.back.record_stream(*to_device_stream);
        s.host = at::Tensor();  // the caching host allocator keeps the block until the copy is done
      }
    }
    returned.emplace(device.type());
    returned->record(*to_device_stream);
  }

  const at::Tensor& storage_back(size_t index) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!reload_queued) queue_copies_back();
    if (!waited) {
      if (returned) returned->block(current_stream(device));
      waited = true;
    }
    return stored[index].back;
  }
};

namespace {

// The group the calling thread's saved tensors go to; null outside an offload scope.
thread_local std::shared_ptr<ActivationOffloader::Group> tls_group;

}  // namespace

// One saved tensor: either kept as it is, or a view (offset, sizes, strides) of a storage of its group.
class OffloadHook final : public torch::autograd::SavedVariableHooks {
 public:
  explicit OffloadHook(std::shared_ptr<ActivationOffloader::Group> group) : group_(std::move(group)) {}

  void call_pack_hook(const at::Tensor& t) override {
    ActivationOffloader::Group& g = *group_;
    const c10::StorageImpl* impl = t.defined() && t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
    const bool parameter = (t.is_leaf() && t.requires_grad()) || (t.is_view() && t._base().is_leaf() && t._base().requires_grad());
    const bool keep = impl == nullptr || parameter || t.device() != g.device ||
                      t.numel() < g.owner->min_elements_ || g.owner->kept_.count(impl) != 0;
    if (keep) {
      kept_ = t.detach();  // no autograd metadata: a saved output must not hold its own grad_fn
      return;
    }
    auto [it, added] = g.position.emplace(impl, g.stored.size());
    if (added) {
      g.stored.push_back({t.storage(), int64_t(impl->nbytes()), {}, {}});
      g.owner->counts_.storages += 1;
      g.owner->counts_.bytes += int64_t(impl->nbytes());
    }
    g.owner->counts_.tensors += 1;
    index_ = it->second;
    options_ = t.options();
    offset_ = t.storage_offset();
    sizes_ = t.sizes().vec();
    strides_ = t.strides().vec();
  }

  at::Tensor call_unpack_hook() override {
    if (kept_.defined() || options_ == std::nullopt) return kept_;
    const at::Tensor& bytes = group_->storage_back(index_);
    at::Tensor t = at::empty({0}, *options_);
    t.set_(bytes.storage(), offset_, sizes_, strides_);
    return t;
  }

 private:
  std::shared_ptr<ActivationOffloader::Group> group_;
  at::Tensor kept_;
  size_t index_ = 0;
  std::optional<at::TensorOptions> options_;
  int64_t offset_ = 0;
  std::vector<int64_t> sizes_, strides_;
};

namespace {

// The autograd engine with default saved-tensor hooks from C++: the base engine's behaviour in
// every other respect (no hooks outside an offload scope).
class OffloadingEngine final : public torch::autograd::Engine {
 public:
  static torch::autograd::Engine& get() {
    static OffloadingEngine engine;
    return engine;
  }
  ~OffloadingEngine() override { stop(); }  // what LibTorch asks of a subclass (its worker threads read the vtable)
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (!tls_group) return nullptr;
    return std::make_unique<OffloadHook>(tls_group);
  }
};

// Installed before main, as PyTorch's Python engine installs itself at import: LibTorch starts the
// autograd threads of the accelerators once per process, for whichever engine runs the first
// backward, so an engine installed later would have none (and an assertion fails on CUDA).
const bool engine_installed = [] {
  torch::autograd::set_default_engine_stub(&OffloadingEngine::get);
  return true;
}();

}  // namespace

ActivationOffloader::ActivationOffloader(int64_t num_layers, const at::Device& device, int64_t min_elements)
    : num_layers_(num_layers), device_(device), min_elements_(min_elements) {
  TORCH_CHECK(engine_installed, "the offloading autograd engine is not installed");
  if (device_.is_cuda()) {
    to_host_stream_ = pooled_stream(device_, /*high_priority=*/false);
    to_device_stream_ = pooled_stream(device_, /*high_priority=*/false);
  }
}

ActivationOffloader::~ActivationOffloader() = default;

ActivationOffloader::Scope::Scope(Scope&& other) noexcept : previous_(std::move(other.previous_)), active_(other.active_) {
  other.active_ = false;
}

ActivationOffloader::Scope::~Scope() {
  if (active_) tls_group = std::move(previous_);
}

ActivationOffloader::Scope ActivationOffloader::scope(int64_t layer) {
  Scope s;
  if (!offloads(layer)) return s;
  open_ = std::make_shared<Group>();
  open_->owner = this;
  open_->device = device_;
  open_->to_host_stream = to_host_stream_;
  open_->to_device_stream = to_device_stream_;
  s.previous_ = tls_group;
  s.active_ = true;
  tls_group = open_;
  return s;
}

void ActivationOffloader::release(Group& group) {
  if (group.released) return;
  if (group.copied) group.copied->block(current_stream(device_));
  for (Group::Stored& s : group.stored) s.device = {};
  group.released = true;
}

void ActivationOffloader::after_layer(int64_t layer, const at::Tensor& output) {
  // The group before this layer's: its copies were queued a layer ago.
  if (previous_) release(*previous_);
  if (previous_ && output.defined() && output.requires_grad()) {
    // This layer's backward begins when the gradient reaches its output: the group before it comes back meanwhile.
    std::weak_ptr<Group> weak = previous_;
    output.register_hook([weak](const at::Tensor&) {
      if (const std::shared_ptr<Group> g = weak.lock()) {
        std::lock_guard<std::mutex> lock(g->mutex);
        if (!g->reload_queued) g->queue_copies_back();
      }
    });
  }
  previous_.reset();
  if (!offloads(layer) || !open_) return;
  open_->queue_copies_to_host();
  previous_ = std::move(open_);
}

void ActivationOffloader::finish_forward() {
  if (previous_) release(*previous_);
  previous_.reset();
  open_.reset();
  last_counts_ = counts_;
  counts_ = {};
}

void ActivationOffloader::keep_on_device(const at::Tensor& t) {
  if (t.defined() && t.has_storage()) kept_.insert(t.storage().unsafeGetStorageImpl());
}

}  // namespace megatron
