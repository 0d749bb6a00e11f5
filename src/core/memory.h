// How much memory tensors use on a device, for the memory report after the first iterations.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace megatron {

// Bytes allocated now: the caching allocator's count on an accelerator; on CPU the C heap in
// use (glibc's arenas plus mmapped blocks, which is where CPU tensors live).
int64_t allocated_bytes(const c10::Device& device);

// The allocator's peak since start on an accelerator; -1 on CPU (no allocator keeps one: the
// trainer samples allocated_bytes instead).
int64_t max_allocated_bytes(const c10::Device& device);

}  // namespace megatron
