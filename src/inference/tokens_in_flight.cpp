#include "inference/tokens_in_flight.h"

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace megatron {

TokensInFlight::TokensInFlight(at::Tensor on_device) : on_device_(std::move(on_device)) {
  if (!on_device_.is_cuda()) {
    on_host_ = on_device_.to(at::kCPU);
    return;
  }
  // Pinned, so the copy does not wait for the stream; the host allocator keeps the buffer until
  // the copy has run.
  on_host_ = at::empty(on_device_.sizes(), at::TensorOptions().dtype(on_device_.scalar_type()).pinned_memory(true));
  on_host_.copy_(on_device_, /*non_blocking=*/true);
  const c10::Device device = on_device_.device();
  copied_.emplace(device.type());
  copied_->record(c10::impl::getDeviceGuardImpl(device.type())->getStream(device));
}

const at::Tensor& TokensInFlight::on_host() {
  if (copied_) {
    copied_->synchronize();
    copied_.reset();
  }
  return on_host_;
}

}  // namespace megatron
