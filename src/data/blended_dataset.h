// Megatron-Core's BlendedDataset and the part of BlendedMegatronDatasetBuilder that decides what
// gets built: `--data-path [w1] p1 [w2] p2 ...` becomes, per split, either one GPTDataset or a
// blend of one GPTDataset per prefix, sized and ordered exactly as megatron-core 0.16 does:
//   - weights are normalised in float64 (numpy's sum), then normalised again by the blend;
//   - dataset i of a blend of `size` samples is asked for ceil(ceil(size * w_i) * 1.005) samples
//     and the blend holds sum_i ceil(size * w_i) samples;
//   - sample s of the blend comes from the dataset maximising w_i * max(s, 1) - taken_i (strict >,
//     ties to the lowest index), which takes its next sample;
//   - unweighted prefixes (several) are weighted by their one-epoch sample counts.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/gpt_dataset.h"

namespace megatron {

// Megatron's get_blend_from_list: an even-length list whose every other item parses as a number
// is (weight, prefix) pairs; anything else is a list of prefixes. Throws UserError for an empty
// list or a weight that is not positive and finite, naming `flag`.
struct DataBlend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;  // as given, not normalised
};
DataBlend parse_data_path(const std::vector<std::string>& data_path, const std::string& flag = "--data-path");

// Samples each split must supply, as Megatron-LM's training loop asks for them:
// train_iters * gbs, (train_iters / eval_interval + 1) * eval_iters * gbs, eval_iters * gbs.
std::array<int64_t, 3> megatron_split_num_samples(int64_t train_iters, int64_t global_batch_size,
                                                  int64_t eval_interval, int64_t eval_iters);

// ceil(ceil(target * w) * (1 + surplus)) for one dataset weight (Megatron's
// _get_size_per_split_per_dataset; surplus 0 gives the blend's share, 0.005 the dataset's size).
int64_t blend_dataset_share(double normalized_weight, int64_t target, double surplus);

// build_blending_indices: dataset id and the sample taken from it, for each of `size` samples.
void build_blending_indices(const std::vector<double>& weights, int64_t size, std::vector<int16_t>* dataset_index,
                            std::vector<int64_t>* dataset_sample_index);

class BlendedDataset : public SequenceDataset {
 public:
  // weights need not be normalised (normalised here, as Megatron's BlendedDataset does). With a
  // non-empty cache_dir the two indices are cached there like the GPTDataset ones; Megatron has no
  // default location for blend caches, so an empty one builds them in memory.
  // Throws UserError when a dataset is too small for its share of the blend.
  BlendedDataset(std::vector<std::shared_ptr<GPTDataset>> datasets, const std::vector<double>& weights, int64_t size,
                 const std::string& cache_dir);

  int64_t size() const override { return size_; }
  int64_t seq_length() const override { return datasets_[0]->seq_length(); }
  void sample(int64_t index, int64_t* out) const override;
  std::string describe() const override;

  const std::vector<std::shared_ptr<GPTDataset>>& datasets() const { return datasets_; }
  const std::vector<double>& weights() const { return weights_; }  // normalised as used
  const NpyArray& dataset_index() const { return dataset_index_; }                // [size] int16
  const NpyArray& dataset_sample_index() const { return dataset_sample_index_; }  // [size] int64
  bool loaded_from_cache() const { return loaded_from_cache_; }

 private:
  bool try_load(const std::string& base);
  void validate_loaded() const;

  std::vector<std::shared_ptr<GPTDataset>> datasets_;
  std::vector<double> weights_;
  int64_t size_;
  std::string description_;
  NpyArray dataset_index_, dataset_sample_index_;
  bool loaded_from_cache_ = false;
};

// Builds what Megatron builds for one split of `--data-path` with `--split`: nullptr for a split
// of weight zero, a GPTDataset for one unweighted prefix, else a BlendedDataset. `num_samples` is
// the split's sample count (megatron_split_num_samples); `config.cache_dir` is --data-cache-path.
std::shared_ptr<SequenceDataset> build_gpt_split_dataset(const std::vector<std::string>& data_path,
                                                         const std::string& split_string, Split split,
                                                         int64_t num_samples, const GPTDatasetConfig& config);

// What Megatron builds for a split given its own prefixes (--train-data-path, --valid-data-path,
// --test-data-path: its blend_per_split): every dataset whole, a lone prefix (weighted or not) a
// GPTDataset, several a BlendedDataset sized as under --data-path; nullptr when `split_data_path`
// is empty (that split has no data).
std::shared_ptr<SequenceDataset> build_gpt_own_split_dataset(const std::vector<std::string>& split_data_path, Split split,
                                                             int64_t num_samples, const GPTDatasetConfig& config);

}  // namespace megatron
