// Work split over plain threads. at::parallel_for runs its body serially in megatron.cpp: its
// OpenMP backend is a pragma in ATen's header, and this code is not built with OpenMP (LibTorch
// brings its own runtime, which a second one beside it would fight). The caller's thread takes
// a share; the first exception thrown is rethrown once all have stopped.
#pragma once

#include <cstdint>
#include <functional>

namespace megatron {

// body(begin, end) over [0, n) in at most `threads` contiguous ranges, each a multiple of `align`
// elements (but the last) and at least `min_per_thread` long.
void parallel_ranges(int64_t n, int threads, int64_t min_per_thread, int64_t align,
                     const std::function<void(int64_t, int64_t)>& body);

// item(i) for every i in [0, n), handed out one at a time to `threads` threads: for items of
// very different cost (tensors of different sizes).
void parallel_items(int64_t n, int threads, const std::function<void(int64_t)>& item);

}  // namespace megatron
