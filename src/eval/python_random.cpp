#include "eval/python_random.h"

#include <cmath>
#include <stdexcept>
#include <unordered_set>

namespace megatron::eval {
namespace {

std::vector<uint32_t> seed_words(int64_t seed) {
  // abs() of the most negative int64 still fits an unsigned 64-bit word.
  uint64_t a = seed < 0 ? uint64_t(0) - uint64_t(seed) : uint64_t(seed);
  std::vector<uint32_t> words;
  do {
    words.push_back(uint32_t(a & 0xffffffffu));
    a >>= 32;
  } while (a != 0);
  return words;  // 0 seeds as [0], as CPython's init_by_array(key of length 1)
}

int bit_length(uint64_t n) {
  int bits = 0;
  for (; n != 0; n >>= 1) ++bits;
  return bits;
}

}  // namespace

PythonRandom::PythonRandom(int64_t seed) : mt_(NumpyRandomState::from_key(seed_words(seed))) {}

uint32_t PythonRandom::getrandbits(int k) {
  if (k < 0 || k > 32) throw std::invalid_argument("PythonRandom::getrandbits: k must be 0..32");
  if (k == 0) return 0;
  return mt_.next_uint32() >> (32 - k);
}

uint64_t PythonRandom::randbelow(uint64_t n) {
  if (n == 0 || n > 0xffffffffull) throw std::invalid_argument("PythonRandom::randbelow: n must be 1..2^32-1");
  const int k = bit_length(n);  // not of n - 1: n can be 1
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

std::vector<size_t> PythonRandom::sample(size_t n, size_t k) {
  if (k > n) throw std::invalid_argument("PythonRandom::sample: sample larger than population");
  std::vector<size_t> result(k);
  // CPython's choice between its two methods: an n-list against a k-set's size.
  size_t setsize = 21;
  if (k > 5) setsize += size_t(std::pow(4.0, std::ceil(std::log(double(k * 3)) / std::log(4.0))));
  if (n <= setsize) {
    std::vector<size_t> pool(n);
    for (size_t i = 0; i < n; ++i) pool[i] = i;
    for (size_t i = 0; i < k; ++i) {
      const size_t j = size_t(randbelow(n - i));
      result[i] = pool[j];
      pool[j] = pool[n - i - 1];  // the last unselected one moves into the vacancy
    }
  } else {
    std::unordered_set<size_t> selected;
    for (size_t i = 0; i < k; ++i) {
      size_t j = size_t(randbelow(n));
      while (selected.count(j) != 0) j = size_t(randbelow(n));
      selected.insert(j);
      result[i] = j;
    }
  }
  return result;
}

}  // namespace megatron::eval
