// numpy's legacy RandomState in C++ against numpy itself: seeding (integer and array), shuffle of
// int64 and int32 arrays of many lengths, bounded draws on both sides of 2^32 (the 64-bit branch
// of random_interval, which shuffles only reach beyond 2^32 elements), and numpy's pairwise sum.
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "data/npy_file.h"
#include "data/numpy_random.h"
#include "reference_python.h"

namespace megatron {
namespace {

const std::vector<int64_t> kSeeds = {0, 1, 42, 1234, 4294967295};
const std::vector<int64_t> kLengths = {0, 1, 2, 3, 7, 10, 100, 1000, 4097, 65537, 1048579};
const std::vector<uint64_t> kMaxes = {0,           1,           2,           3,           5,
                                      255,         256,         65535,       2147483647,  2147483648ULL,
                                      4294967294ULL, 4294967295ULL, 4294967296ULL, 4294967297ULL,
                                      (1ULL << 40) + 12345, 6000000000000000000ULL, (1ULL << 62)};

class NumpyRandomTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = reference::make_temp_dir("numpy_random_test");
    std::string seeds, lengths, maxes;
    for (int64_t s : kSeeds) seeds += std::to_string(s) + " ";
    for (int64_t n : kLengths) lengths += std::to_string(n) + " ";
    for (uint64_t m : kMaxes) maxes += std::to_string(m) + " ";
    const std::string spec = dir_ + "/spec.txt";
    std::ofstream(spec) << "numpy | np | " << seeds << " | " << lengths << " | " << maxes << "\n";
    setup_error_ = reference::run_reference_script("megatron_reference_indices.py",
                                                   reference::shell_quote(spec) + " " + reference::shell_quote(dir_));
  }
  // A failed reference run fails every test instead of skipping it.
  void SetUp() override { ASSERT_EQ(setup_error_, ""); }
  static void TearDownTestSuite() { reference::remove_tree(dir_); }

  static NpyArray load(const std::string& name) { return NpyArray::map_file(dir_ + "/" + name); }
  static std::string setup_error_;
  static std::string dir_;
};
std::string NumpyRandomTest::setup_error_;
std::string NumpyRandomTest::dir_;

TEST_F(NumpyRandomTest, IntegerSeedStateMatchesNumpy) {
  for (int64_t seed : kSeeds) {
    const NpyArray ref = load("np-state-" + std::to_string(seed) + ".npy");
    NumpyRandomState rs(seed);
    ASSERT_EQ(ref.size(), 625u);
    for (size_t i = 0; i < 624; ++i) ASSERT_EQ(int64_t{rs.key()[i]}, ref[i]) << "seed " << seed << " word " << i;
    EXPECT_EQ(rs.position(), ref[624]);
  }
}

TEST_F(NumpyRandomTest, ArraySeedStateMatchesNumpy) {
  for (int64_t seed : kSeeds) {
    const NpyArray ref = load("np-keystate-" + std::to_string(seed) + ".npy");
    const uint32_t s = static_cast<uint32_t>(seed);
    NumpyRandomState rs = NumpyRandomState::from_key({s, s ^ 0x5A5A5A5AU, 3});
    for (size_t i = 0; i < 624; ++i) ASSERT_EQ(int64_t{rs.key()[i]}, ref[i]) << "seed " << seed << " word " << i;
    EXPECT_EQ(rs.position(), ref[624]);
  }
}

TEST_F(NumpyRandomTest, ShuffleMatchesNumpy) {
  for (int64_t seed : kSeeds) {
    for (int64_t n : kLengths) {
      const std::string tag = std::to_string(seed) + "-" + std::to_string(n) + ".npy";
      const NpyArray ref64 = load("np-shuffle-" + tag);
      const NpyArray ref32 = load("np-shuffle32-" + tag);
      std::vector<int64_t> a(static_cast<size_t>(n));
      std::vector<int32_t> b(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) a[static_cast<size_t>(i)] = b[static_cast<size_t>(i)] = static_cast<int32_t>(i);
      NumpyRandomState(seed).shuffle(a);
      NumpyRandomState(seed).shuffle(b);
      ASSERT_EQ(ref64.size(), a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a[i], ref64[i]) << "seed " << seed << " n " << n << " at " << i;
        ASSERT_EQ(int64_t{b[i]}, ref32[i]) << "int32, seed " << seed << " n " << n << " at " << i;
      }
    }
  }
}

TEST_F(NumpyRandomTest, BoundedDrawsMatchNumpyAcross32Bits) {
  for (int64_t seed : kSeeds) {
    const NpyArray ref = load("np-interval-" + std::to_string(seed) + ".npy");
    NumpyRandomState rs(seed);
    ASSERT_EQ(ref.size(), kMaxes.size() + 2);
    for (size_t i = 0; i < kMaxes.size(); ++i) {
      ASSERT_EQ(static_cast<int64_t>(rs.random_interval(kMaxes[i])), ref[i]) << "seed " << seed << " max " << kMaxes[i];
    }
    EXPECT_EQ(rs.random_integers(-5, 5), ref[kMaxes.size()]);
    EXPECT_EQ(rs.randint(-(int64_t{1} << 40), int64_t{1} << 40), ref[kMaxes.size() + 1]);
  }
}

TEST_F(NumpyRandomTest, PairwiseSumMatchesNumpyBitwise) {
  const NpyArray weights = load("np-weights.npy");
  const NpyArray sums = load("np-sum.npy");
  std::vector<double> w(weights.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const int64_t bits = weights[i];
    std::memcpy(&w[i], &bits, 8);
  }
  for (size_t n = 1; n <= w.size(); ++n) {
    const double got = numpy_sum(w.data(), n);
    int64_t bits;
    std::memcpy(&bits, &got, 8);
    ASSERT_EQ(bits, sums[n - 1]) << "sum of the first " << n << " weights";
  }
}

TEST(NumpyRandom, RejectsSeedsNumpyRejects) {
  EXPECT_THROW(NumpyRandomState(-1), std::invalid_argument);
  EXPECT_THROW(NumpyRandomState(int64_t{1} << 32), std::invalid_argument);
  EXPECT_NO_THROW(NumpyRandomState(4294967295));
}

TEST(NumpyRandom, ShuffleIsAPermutation) {
  std::vector<int64_t> v(5000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i);
  NumpyRandomState(3).shuffle(v);
  std::vector<bool> seen(v.size(), false);
  for (int64_t x : v) {
    ASSERT_FALSE(seen[static_cast<size_t>(x)]);
    seen[static_cast<size_t>(x)] = true;
  }
}

}  // namespace
}  // namespace megatron
