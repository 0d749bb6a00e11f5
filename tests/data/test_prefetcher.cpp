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

// A batch's named extra fields travel with the fixed ones: the prefetcher hands them over, and
// every field is visited under one name, fixed ones first, which the trainer's pinning, device
// moves and graph-input copies rely on.
TEST(BatchFields, ExtraFieldsTravelWithTheBatch) {
  BatchPrefetcher prefetcher([](int64_t first) {
    Batch b;
    b.tokens = at::full({1, 4}, first, at::kLong);
    b.extra["advantages"] = at::full({1, 4}, double(first) / 2, at::kFloat);
    return b;
  }, /*stride=*/2);
  Batch b = prefetcher.get(6);
  ASSERT_TRUE(b.extra.count("advantages"));
  EXPECT_EQ(b.extra["advantages"][0][0].item<float>(), 3.0f);
  std::vector<std::string> names;
  b.for_each([&](const std::string& name, const at::Tensor&) { names.push_back(name); });
  EXPECT_EQ(names, (std::vector<std::string>{"tokens", "labels", "loss mask", "position ids", "attention mask", "advantages"}));
  EXPECT_TRUE(b.field("advantages").equal(b.extra["advantages"]));
  EXPECT_TRUE(b.field("tokens").equal(b.tokens));
}

}  // namespace
}  // namespace megatron
