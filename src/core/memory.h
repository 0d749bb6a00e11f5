// How much memory tensors use on a device, for the memory report after the first iterations.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace megatron {

// Bytes allocated now: the caching allocator's count on an accelerator; on CPU the C heap in
// use (glibc's arenas plus mmapped blocks, which is where CPU tensors live).
int64_t allocated_bytes(const c10::Device& device);

// The allocator's peak since start on an accelerator; -1 on CPU (no allocator keeps one: the
// trainer samples allocated_bytes instead).
int64_t max_allocated_bytes(const c10::Device& device);

// The caching allocator's counters (Megatron's --log-memory-to-tensorboard series); nullopt on
// CPU, which has no such allocator.
struct AllocatorStatistics {
  int64_t reserved_bytes = 0, allocated_bytes = 0, max_allocated_bytes = 0, allocation_count = 0;
};
std::optional<AllocatorStatistics> allocator_statistics(const c10::Device& device);

// Runs `allocate`; an allocation that fails (host or device memory exhausted, or a size no
// allocator takes) becomes a UserError beginning with `what`, which names what was allocated and
// the flags or fields that size it: a too-large model is the user's to fix, not an abort.
void allocating(const std::string& what, const std::function<void()>& allocate);

}  // namespace megatron
