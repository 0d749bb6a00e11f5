// Device streams through c10's device-generic interface (no CUDA headers, so CPU builds compile
// the same code): the calling thread's current stream, a pooled stream, and one stream ordered
// after the work already queued on another.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace megatron {

inline c10::Stream current_stream(const c10::Device& device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

inline c10::Stream pooled_stream(const c10::Device& device, bool high_priority) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device, high_priority);
}

// Work queued on `after` from now on runs after the work already queued on `before`.
inline void order_after(const c10::Stream& before, const c10::Stream& after) {
  c10::Event done(before.device_type());
  done.record(before);
  done.block(after);
}

}  // namespace megatron
