// Python's random.Random, reduced to what lm-evaluation-harness's few-shot sampler draws:
// integer seeding and random.sample over a list. Both run on MT19937 seeded by init_by_array
// with the seed's 32-bit words (as numpy's array seeding: data/numpy_random.h), and every draw
// consumes exactly the 32-bit outputs CPython consumes, so the same seed picks the same examples
// in the same order as `random.Random(seed).sample(population, k)`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "data/numpy_random.h"

namespace megatron::eval {

class PythonRandom {
 public:
  explicit PythonRandom(int64_t seed);  // random.Random(seed): abs(seed)'s 32-bit words, low first

  // random.getrandbits(k) for 0 <= k <= 32: the top k bits of one 32-bit output.
  uint32_t getrandbits(int k);
  // random._randbelow(n), n >= 1: getrandbits(bit_length(n)) until below n.
  uint64_t randbelow(uint64_t n);
  // random.sample(range(n), k): k distinct indices in the order CPython picks them (a shrinking
  // pool when n is small against k, else draws retried on repeats). std::invalid_argument when
  // k > n, as CPython's ValueError.
  std::vector<size_t> sample(size_t n, size_t k);

 private:
  NumpyRandomState mt_;
};

}  // namespace megatron::eval
