// First-fit-decreasing bin packing with a max-segment-tree: "the first bin with at least L free"
// is a descent from the root, so each placement costs O(log n) instead of a scan over all bins.
#include "data/sft_packing.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace megatron {

std::vector<std::vector<uint32_t>> pack_first_fit_decreasing(const std::vector<int64_t>& lengths,
                                                             int64_t capacity) {
  if (capacity < 1) throw std::invalid_argument("pack_first_fit_decreasing: capacity must be positive");
  for (int64_t len : lengths) {
    if (len < 1 || len > capacity) {
      throw std::invalid_argument("pack_first_fit_decreasing: sample length " + std::to_string(len) +
                                  " outside [1, " + std::to_string(capacity) + "]");
    }
  }
  std::vector<uint32_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return lengths[a] > lengths[b]; });

  // Leaves are bins (at most one per sample), all starting empty: the leftmost leaf with room is
  // an open bin when one fits, else the first unopened one, which is exactly first fit.
  size_t leaves = 1;
  while (leaves < std::max<size_t>(lengths.size(), 1)) leaves *= 2;
  std::vector<int64_t> free_space(2 * leaves, capacity);  // node = max free space below it
  std::vector<std::vector<uint32_t>> bins;
  for (uint32_t sample : order) {
    const int64_t len = lengths[sample];
    size_t node = 1;
    while (node < leaves) node = free_space[2 * node] >= len ? 2 * node : 2 * node + 1;
    const size_t bin = node - leaves;
    if (bin == bins.size()) bins.emplace_back();
    bins[bin].push_back(sample);
    free_space[node] -= len;
    for (node /= 2; node >= 1; node /= 2) free_space[node] = std::max(free_space[2 * node], free_space[2 * node + 1]);
  }
  return bins;
}

}  // namespace megatron
