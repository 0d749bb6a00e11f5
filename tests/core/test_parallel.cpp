// core/parallel.h: every element or item handled exactly once, ranges aligned, several threads
// really at work, and an exception from any thread reaching the caller.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/parallel.h"

namespace megatron {
namespace {

TEST(Parallel, RangesCoverEveryElementOnceInAlignedPieces) {
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(1000), int64_t(100003)}) {
    std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
    std::mutex mutex;
    std::set<std::thread::id> threads;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    parallel_ranges(n, 4, 1000, 64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) ++seen[size_t(i)];
      std::lock_guard<std::mutex> lock(mutex);
      threads.insert(std::this_thread::get_id());
      ranges.emplace_back(begin, end);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[size_t(i)], 1) << "n " << n << " element " << i;
    for (const auto& [begin, end] : ranges) EXPECT_EQ(begin % 64, 0) << "n " << n;
    EXPECT_EQ(threads.size(), n >= 4000 ? 4u : n == 0 ? 0u : std::max<size_t>(1, size_t(n / 1000))) << "n " << n;
  }
}

TEST(Parallel, ItemsAreEachHandledOnceAndErrorsReachTheCaller) {
  std::vector<std::atomic<int>> seen(37);
  parallel_items(37, 3, [&](int64_t i) { ++seen[size_t(i)]; });
  for (const auto& s : seen) EXPECT_EQ(s, 1);
  EXPECT_THROW(parallel_items(10, 3, [](int64_t i) {
                 if (i == 7) throw std::runtime_error("item 7");
               }),
               std::runtime_error);
  EXPECT_THROW(parallel_ranges(10000, 2, 100, 1, [](int64_t begin, int64_t) {
                 if (begin > 0) throw std::runtime_error("second range");
               }),
               std::runtime_error);
}

}  // namespace
}  // namespace megatron
