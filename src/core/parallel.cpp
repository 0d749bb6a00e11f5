// Plain-thread work splitting; see parallel.h.
#include "core/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace megatron {
namespace {

// Runs work(t) for t in [0, count) on count - 1 new threads and the caller's.
void run_on_threads(int count, const std::function<void(int)>& work) {
  std::exception_ptr first;
  std::mutex mutex;
  auto guarded = [&](int t) {
    try {
      work(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!first) first = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  for (int t = 1; t < count; ++t) workers.emplace_back(guarded, t);
  guarded(0);
  for (std::thread& w : workers) w.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace

void parallel_ranges(int64_t n, int threads, int64_t min_per_thread, int64_t align,
                     const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  const int64_t count = std::max<int64_t>(1, std::min<int64_t>(threads, n / std::max<int64_t>(1, min_per_thread)));
  if (count == 1) return body(0, n);
  const int64_t per = (n / count + align - 1) / align * align;
  run_on_threads(int(count), [&](int t) {
    const int64_t begin = std::min(n, t * per), end = t + 1 == count ? n : std::min(n, (t + 1) * per);
    if (begin < end) body(begin, end);
  });
}

void parallel_items(int64_t n, int threads, const std::function<void(int64_t)>& item) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  run_on_threads(int(std::max<int64_t>(1, std::min<int64_t>(threads, n))), [&](int) {
    for (int64_t i = next++; i < n; i = next++) item(i);
  });
}

}  // namespace megatron
