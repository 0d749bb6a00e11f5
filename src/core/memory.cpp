#include "core/memory.h"

#include <ATen/DeviceAccelerator.h>
#include <c10/util/Exception.h>
#include <malloc.h>
#if defined(__SANITIZE_ADDRESS__)
// The sanitizer runtimes' allocator interface (clang ships its header, g++ 12 does not).
extern "C" size_t __sanitizer_get_current_allocated_bytes();
#endif

#include <new>

#include "core/errors.h"

namespace megatron {

int64_t allocated_bytes(const c10::Device& device) {
  if (device.is_cpu()) {
#if defined(__SANITIZE_ADDRESS__)
    // AddressSanitizer replaces malloc: glibc's counters would see none of the heap (make sanitize).
    return static_cast<int64_t>(__sanitizer_get_current_allocated_bytes());
#else
    const struct mallinfo2 info = mallinfo2();
    return static_cast<int64_t>(info.uordblks + info.hblkhd);
#endif
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

void allocating(const std::string& what, const std::function<void()>& allocate) {
  try {
    allocate();
  } catch (const c10::OutOfMemoryError& e) {  // a device allocator
    throw UserError(what + ": out of memory (" + e.what_without_backtrace() + ")");
  } catch (const c10::Error& e) {
    // LibTorch's CPU allocator fails with a plain enforce error; only that one is the user's.
    const std::string message = e.what_without_backtrace();
    if (message.find("can't allocate memory") == std::string::npos && message.find("not enough memory") == std::string::npos) throw;
    const size_t allocator = message.find("DefaultCPUAllocator");  // past the "[enforce fail at ...]" prefix
    throw UserError(what + ": out of memory (" + message.substr(allocator == std::string::npos ? 0 : allocator) + ")");
  } catch (const std::bad_alloc&) {
    throw UserError(what + ": out of host memory");
  } catch (const std::length_error& e) {  // a size past what a container can hold
    throw UserError(what + ": too large (" + e.what() + ")");
  }
}

}  // namespace megatron
