#include "core/memory.h"

#include <ATen/DeviceAccelerator.h>
#include <malloc.h>

namespace megatron {

int64_t allocated_bytes(const c10::Device& device) {
  if (device.is_cpu()) {
    const struct mallinfo2 info = mallinfo2();
    return static_cast<int64_t>(info.uordblks + info.hblkhd);
  }
  const auto stats = at::accelerator::getDeviceStats(device.index());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
}

std::optional<AllocatorStatistics> allocator_statistics(const c10::Device& device) {
  if (device.is_cpu()) return std::nullopt;
  const auto stats = at::accelerator::getDeviceStats(device.index());
  const size_t all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return AllocatorStatistics{stats.reserved_bytes[all].current, stats.allocated_bytes[all].current, stats.allocated_bytes[all].peak,
                             stats.allocation[all].current};
}

int64_t max_allocated_bytes(const c10::Device& device) {
  if (device.is_cpu()) return -1;
  const auto stats = at::accelerator::getDeviceStats(device.index());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
}

}  // namespace megatron
