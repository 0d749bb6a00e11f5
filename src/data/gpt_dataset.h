// Megatron-Core's GPTDataset without torch: the train / valid / test split of an indexed dataset,
// and its three indices, built exactly as megatron/core/datasets/gpt_dataset.py (0.16) builds them
// so a run here reads the same samples in the same order as Megatron for the same seed:
//   document index: the split's sequence ids repeated for E epochs, shuffled (the final epoch
//                   shuffled on its own when it would supply < 80% of an epoch's samples);
//   sample index:   (document-index position, token offset) where each sample starts; a sample
//                   is seq_length + 1 tokens and consecutive samples share one token;
//   shuffle index:  a permutation of the samples (the separate final epoch permuted on its own).
// All draws come from one numpy RandomState(seed), in Megatron's order. The indices are cached as
// .npy files (numpy.save's bytes) under the cache directory, written atomically, and memory-mapped.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/indexed_dataset.h"
#include "data/npy_file.h"
#include "data/numpy_random.h"
#include "data/samples.h"

namespace megatron {

const char* split_name(Split split);  // "train", "valid", "test"

// Megatron's split matrix: per split the [begin, end) fraction of the dataset, or none for a split
// of weight zero. From a split string such as "969,30,1" (numbers normalised by their sum, missing
// ones zero). Throws UserError naming --split for anything else.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;
SplitMatrix parse_split_matrix(const std::string& split);

// Sequence range [round(begin * n), round(end * n)) of a split, rounding halves to even as
// Python's round() does; none where the split matrix has none.
std::optional<std::pair<int64_t, int64_t>> split_sequence_range(const SplitMatrix& matrix, Split split,
                                                                int64_t num_sequences);

// A dataset of fixed-length samples (seq_length + 1 tokens each).
class SequenceDataset {
 public:
  virtual ~SequenceDataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t seq_length() const = 0;
  // Writes seq_length + 1 tokens of sample `index` in [0, size()).
  virtual void sample(int64_t index, int64_t* out) const = 0;
  virtual std::string describe() const = 0;
};

struct GPTDatasetConfig {
  int64_t seq_length = 0;
  int64_t seed = 1234;     // numpy RandomState seed: [0, 2^32)
  // Where the index caches live; "" means Megatron's default, <prefix>/cache/GPTDataset_indices.
  std::string cache_dir;
  bool use_cache = true;   // false: build in memory, read and write nothing
  bool verbose = false;    // one line on stderr per index build or load
};

// --- The index builders, exposed for tests. -----------------------------------------------------

// Smallest E >= 1 with E * tokens_per_epoch >= num_samples * seq_length + 1; 1 when num_samples is
// none (Megatron's "one epoch").
int64_t gpt_num_epochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples, int64_t seq_length);
// Whether the final epoch is shuffled separately (it supplies fewer than int(0.8 * samples/epoch)).
bool gpt_separate_final_epoch(int64_t tokens_per_epoch, int64_t num_epochs, std::optional<int64_t> num_samples,
                              int64_t seq_length);
std::vector<int32_t> build_document_index(const std::vector<int32_t>& sequence_ids, int64_t num_epochs,
                                          NumpyRandomState& rng, bool separate_final_epoch);
// Rows (document-index position, offset), flattened: 2 * (num_samples + 1) values.
std::vector<int64_t> build_sample_index(const PackedArrayView<int32_t>& sequence_lengths,
                                        const std::vector<int32_t>& document_index, int64_t seq_length,
                                        int64_t num_epochs, int64_t tokens_per_epoch);
// [0, num_samples) shuffled, then [num_samples, total) shuffled after it when total is larger.
std::vector<int64_t> build_shuffle_index(int64_t num_samples, int64_t total, NumpyRandomState& rng);

// --- The dataset. -------------------------------------------------------------------------------

class GPTDataset : public SequenceDataset {
 public:
  // `range` is the split's sequence range (split_sequence_range); num_samples none builds one epoch.
  // Throws UserError for an empty split, a bad seed, or an unusable cache directory.
  GPTDataset(std::shared_ptr<const IndexedDataset> dataset, Split split, std::pair<int64_t, int64_t> range,
             std::optional<int64_t> num_samples, const GPTDatasetConfig& config);

  int64_t size() const override { return static_cast<int64_t>(shuffle_index_.size()); }
  int64_t seq_length() const override { return config_.seq_length; }
  void sample(int64_t index, int64_t* out) const override;
  std::string describe() const override;

  // The sequence ids of sample `index`'s tokens, in order (Megatron returns them with the text).
  std::vector<int64_t> sample_sequence_ids(int64_t index) const;

  Split split() const { return split_; }
  int64_t num_epochs() const { return num_epochs_; }
  bool separate_final_epoch() const { return separate_final_epoch_; }
  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  std::optional<int64_t> num_samples_requested() const { return num_samples_; }
  bool loaded_from_cache() const { return loaded_from_cache_; }
  // The parameters that determine the indices (the cache key), and the cache file prefix.
  const std::string& description() const { return description_; }
  std::string cache_path(const std::string& suffix) const;

  const NpyArray& document_index() const { return document_index_; }  // [E * docs] int32
  const NpyArray& sample_index() const { return sample_index_; }      // [n + 1, 2] int32 / int64
  const NpyArray& shuffle_index() const { return shuffle_index_; }    // [n] uint32 / int64

 private:
  void build();
  bool try_load();
  void validate_loaded() const;

  std::shared_ptr<const IndexedDataset> dataset_;
  Split split_;
  std::pair<int64_t, int64_t> range_;
  std::optional<int64_t> num_samples_;
  GPTDatasetConfig config_;
  int64_t tokens_per_epoch_ = 0;
  int64_t num_epochs_ = 1;
  bool separate_final_epoch_ = false;
  bool loaded_from_cache_ = false;
  std::string description_;
  std::string cache_base_;  // <cache dir>/<hash>-GPTDataset-<split>
  NpyArray document_index_, sample_index_, shuffle_index_;
};

// 64-bit FNV-1a of a string as 16 hex digits: the cache key (the stored description guards
// against collisions).
std::string fnv1a_hex(const std::string& text);

}  // namespace megatron
