// numpy legacy RandomState (MT19937) draws and numpy's pairwise float64 sum; see numpy_random.h.
#include "data/numpy_random.h"

#include <stdexcept>
#include <string>

namespace megatron {
namespace {

constexpr int kN = 624;
constexpr int kM = 397;
constexpr uint32_t kMatrixA = 0x9908b0dfU;
constexpr uint32_t kUpperMask = 0x80000000U;
constexpr uint32_t kLowerMask = 0x7fffffffU;

// Smallest all-ones mask covering max: the rejection loop draws in [0, mask].
uint64_t covering_mask(uint64_t max) {
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  return mask;
}

}  // namespace

NumpyRandomState::NumpyRandomState(int64_t seed) {
  if (seed < 0 || seed > int64_t{0xffffffff}) {
    throw std::invalid_argument("numpy RandomState seed must be between 0 and 2**32 - 1, got " +
                                std::to_string(seed));
  }
  seed_linear(static_cast<uint32_t>(seed));
}

void NumpyRandomState::seed_linear(uint32_t seed) {
  for (int pos = 0; pos < kN; ++pos) {
    key_[pos] = seed;
    seed = 1812433253U * (seed ^ (seed >> 30)) + static_cast<uint32_t>(pos + 1);
  }
  pos_ = kN;
}

NumpyRandomState NumpyRandomState::from_key(const std::vector<uint32_t>& init_key) {
  if (init_key.empty()) throw std::invalid_argument("numpy RandomState seed array must be non-empty");
  NumpyRandomState rs;
  rs.seed_linear(19650218U);
  uint32_t* mt = rs.key_;
  const size_t len = init_key.size();
  int i = 1;
  size_t j = 0;
  for (size_t k = (static_cast<size_t>(kN) > len ? kN : len); k > 0; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525U)) + init_key[j] + static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= kN) {
      mt[0] = mt[kN - 1];
      i = 1;
    }
    if (j >= len) j = 0;
  }
  for (int k = kN - 1; k > 0; --k) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941U)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= kN) {
      mt[0] = mt[kN - 1];
      i = 1;
    }
  }
  mt[0] = 0x80000000U;  // assures a non-zero state
  rs.pos_ = kN;
  return rs;
}

void NumpyRandomState::generate() {
  auto twist = [](uint32_t a, uint32_t b, uint32_t far) {
    const uint32_t y = (a & kUpperMask) | (b & kLowerMask);
    return far ^ (y >> 1) ^ ((0U - (y & 1U)) & kMatrixA);
  };
  int i = 0;
  for (; i < kN - kM; ++i) key_[i] = twist(key_[i], key_[i + 1], key_[i + kM]);
  for (; i < kN - 1; ++i) key_[i] = twist(key_[i], key_[i + 1], key_[i + kM - kN]);
  key_[kN - 1] = twist(key_[kN - 1], key_[0], key_[kM - 1]);
  pos_ = 0;
}

uint32_t NumpyRandomState::next_uint32() {
  if (pos_ == kN) generate();
  uint32_t y = key_[pos_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= y >> 18;
  return y;
}

uint64_t NumpyRandomState::next_uint64() {
  const uint64_t high = next_uint32();
  return (high << 32) | next_uint32();
}

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  const uint64_t mask = covering_mask(max);
  uint64_t value;
  if (max <= 0xffffffffULL) {
    while ((value = (next_uint32() & mask)) > max) {
    }
  } else {
    while ((value = (next_uint64() & mask)) > max) {
    }
  }
  return value;
}

int64_t NumpyRandomState::randint(int64_t low, int64_t high) {
  if (high <= low) throw std::invalid_argument("randint: low >= high");
  // numpy draws an offset in [0, high - 1 - low] with the same masked loop as random_interval
  // (a full 32- or 64-bit range takes one raw draw, which the mask loop also does).
  const uint64_t range = static_cast<uint64_t>(high) - 1 - static_cast<uint64_t>(low);
  return static_cast<int64_t>(static_cast<uint64_t>(low) + random_interval(range));
}

double numpy_sum(const double* a, size_t n) {
  // numpy's pairwise_sum: the exact association order matters, not just the total.
  if (n < 8) {
    double res = -0.0;
    for (size_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int k = 0; k < 8; ++k) r[k] = a[k];
    size_t i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (int k = 0; k < 8; ++k) r[k] += a[i + k];
    }
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  size_t n2 = n / 2;
  n2 -= n2 % 8;
  return numpy_sum(a, n2) + numpy_sum(a + n2, n - n2);
}

std::vector<double> numpy_normalize(const std::vector<double>& weights) {
  const double total = numpy_sum(weights.data(), weights.size());
  std::vector<double> out(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) out[i] = weights[i] / total;
  return out;
}

}  // namespace megatron
