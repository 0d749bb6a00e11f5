// numpy's legacy random API (numpy.random.RandomState) on its MT19937 bit generator, reduced to
// what Megatron's dataset indices draw: integer seeding, bounded integers and the in-place shuffle
// of a 1-D array. Every draw consumes exactly the 32-bit outputs numpy consumes, so a permutation
// built here equals the one numpy builds for the same seed, element for element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace megatron {

class NumpyRandomState {
 public:
  // RandomState(seed) for an integer seed: numpy's legacy seeding calls mt19937_seed (Knuth's
  // linear recurrence, as MT19937's init_genrand), not init_by_array. numpy rejects seeds outside
  // [0, 2^32); so does this (std::invalid_argument).
  explicit NumpyRandomState(int64_t seed);
  // RandomState(numpy.array(key)): init_by_array, used by numpy for array seeds.
  static NumpyRandomState from_key(const std::vector<uint32_t>& key);

  uint32_t next_uint32();
  // numpy's mt19937_next64: the first 32-bit output is the high word.
  uint64_t next_uint64();

  // random_interval(max): a value in [0, max] by masked rejection sampling; 32-bit draws while
  // max fits in 32 bits, 64-bit draws above. This is what RandomState.shuffle uses.
  uint64_t random_interval(uint64_t max);
  // RandomState.randint(low, high) with an int64 dtype: [low, high), masked rejection (legacy).
  int64_t randint(int64_t low, int64_t high);
  // RandomState.random_integers(low, high): [low, high] inclusive (deprecated in numpy).
  int64_t random_integers(int64_t low, int64_t high) { return randint(low, high + 1); }

  // RandomState.shuffle(x) of a 1-D array: Fisher-Yates from the last index down to 1, swapping
  // x[i] with x[random_interval(i)] (a swap with itself included, it still consumes a draw).
  template <typename T>
  void shuffle(T* data, size_t n) {
    for (size_t i = n > 0 ? n - 1 : 0; i >= 1; --i) {
      const size_t j = static_cast<size_t>(random_interval(i));
      const T tmp = data[j];
      data[j] = data[i];
      data[i] = tmp;
    }
  }
  template <typename T>
  void shuffle(std::vector<T>& v) { shuffle(v.data(), v.size()); }

  // The 624-word key and position, as RandomState.get_state() reports them (for tests).
  const uint32_t* key() const { return key_; }
  int position() const { return pos_; }

 private:
  NumpyRandomState() = default;
  void seed_linear(uint32_t seed);
  void generate();

  static constexpr int kStateLen = 624;
  uint32_t key_[kStateLen] = {};
  int pos_ = kStateLen;
};

// numpy.sum of a contiguous float64 array: numpy's pairwise summation (blocks of 8 partial sums
// up to 128 elements, recursive halving above), which differs from a plain loop in the last bits.
// Megatron normalises blend weights with it, and the normalised weights steer the blend order.
double numpy_sum(const double* values, size_t n);

// megatron.core.datasets.utils.normalize: w / numpy.sum(w) in float64.
std::vector<double> numpy_normalize(const std::vector<double>& weights);

}  // namespace megatron
