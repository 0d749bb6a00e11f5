// Packing of tokenized SFT samples into fixed-size bins (one bin = one training sequence of
// --seq-length inputs + 1 label token), keeping every sample whole and contiguous.
//
// Algorithm: first-fit-decreasing (the "first_fit_decreasing" of NeMo / Megatron-Bridge's
// packed-sequence preparation): samples sorted by length, longest first (ties by input order, so
// the plan is deterministic), each placed in the first bin with room, a new bin opened when none
// has. FFD is within 11/9 of the optimal bin count and usually leaves a few percent of padding
// on chat data; a max-segment-tree over the bins' free space makes it O(n log n).
//
// A bin holds at most capacity = seq_length + 1 tokens: the inputs are its first seq_length
// tokens and the labels its last seq_length, so a bin filled to the brim loses nothing (its last
// token is only ever a label). Samples longer than the capacity are the caller's to truncate or
// drop before planning (see SftLongSamples).
#pragma once

#include <cstdint>
#include <vector>

namespace megatron {

// bins[b] = indices into `lengths` of the samples in bin b, in placement order. Every length must
// be in [1, capacity] (std::invalid_argument otherwise: the caller fits them first).
std::vector<std::vector<uint32_t>> pack_first_fit_decreasing(const std::vector<int64_t>& lengths,
                                                             int64_t capacity);

enum class SftLongSamples { kTruncate, kDrop };

// The length a sample of `length` tokens keeps in a bin: itself when it fits, `capacity` when
// truncated (its first capacity tokens), 0 when dropped.
inline int64_t fitted_sample_length(int64_t length, int64_t capacity, SftLongSamples policy) {
  if (length <= capacity) return length;
  return policy == SftLongSamples::kTruncate ? capacity : 0;
}

}  // namespace megatron
