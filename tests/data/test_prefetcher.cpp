// The background batch prefetcher serves exactly what building the batch directly would give,
// in order, after jumps, and rethrows building errors in the caller.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>

#include "core/errors.h"
#include "data/prefetcher.h"

namespace megatron {
namespace {

Batch numbered(int64_t first) {
  if (first >= 1000) throw UserError("bad sample " + std::to_string(first));
  return {at::full({2, 3}, first, at::kLong), {}, {}};
}

TEST(BatchPrefetcher, ServesSequentialJumpsAndErrors) {
  std::atomic<int> built{0};
  BatchPrefetcher prefetcher([&](int64_t first) { ++built; return numbered(first); }, /*stride=*/2, /*depth=*/3);
  for (int64_t first = 0; first < 40; first += 2) {
    EXPECT_EQ(prefetcher.get(first).tokens[0][0].item<int64_t>(), first);
  }
  EXPECT_EQ(prefetcher.get(500).tokens[0][0].item<int64_t>(), 500);  // a jump (resume) restarts
  EXPECT_EQ(prefetcher.get(502).tokens[0][0].item<int64_t>(), 502);
  EXPECT_EQ(prefetcher.get(4).tokens[0][0].item<int64_t>(), 4);      // and backwards too
  try {
    prefetcher.get(1000);
    FAIL() << "expected the building error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("bad sample 1000"), std::string::npos);
  }
  EXPECT_EQ(prefetcher.get(6).tokens[0][0].item<int64_t>(), 6);      // usable after an error
  EXPECT_GE(built.load(), 24);
}

}  // namespace
}  // namespace megatron
