// What the model code asks of the GPU it runs on, without CUDA headers in its includes.
#pragma once

#include <c10/core/Device.h>

namespace megatron {

// The device's compute capability major version (8: Ampere, 9: Hopper); 0 for a CPU device and in
// a build without CUDA support (MEGATRON_CUDA off), where no CUDA-only path is taken.
int cuda_compute_capability_major(const c10::Device& device);

// Whether the current CUDA stream is capturing a graph (no host synchronisation allowed); false
// in a build without CUDA support.
bool cuda_stream_capturing();

}  // namespace megatron
