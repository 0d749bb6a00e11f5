// The trainer's view of Megatron's GPT data: a SampleSource over one split of `--data-path`, or
// over a split's own `--train-data-path` etc. (GPTDataset or a blend), so the trainer reads
// Megatron's exact sample order through the same interface as the mock and plain-stream sources.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "core/config.h"
#include "data/blended_dataset.h"
#include "data/samples.h"

namespace megatron {

// What the split datasets are built from; the trainer fills it from its flags.
struct GPTDataOptions {
  std::vector<std::string> data_path;  // --data-path, optionally weighted
  // --train-data-path, --valid-data-path, --test-data-path: each split's own (data_path empty)
  std::array<std::vector<std::string>, 3> split_data_path;
  std::string split = "969, 30, 1";    // --split
  int64_t seq_length = 0;              // --seq-length
  int64_t seed = 1234;                 // --seed
  std::string data_cache_path;         // --data-cache-path ("" = Megatron's default per dataset)
  int64_t train_iters = 0;             // --train-iters
  int64_t train_samples = 0;           // --train-samples: the training split's size when given (Megatron)
  int64_t global_batch_size = 0;
  int64_t eval_interval = 1000;        // --eval-interval
  int64_t eval_iters = 100;            // --eval-iters
  // --skip-train: Megatron sizes the validation split for one evaluation (--eval-iters global
  // batches), not for every evaluation of a run, which changes its shuffle.
  bool skip_train = false;
};

GPTDataOptions gpt_data_options(const Config& config, const std::string& data_cache_path);

class GPTSampleSource : public SampleSource {
 public:
  explicit GPTSampleSource(std::shared_ptr<SequenceDataset> dataset) : dataset_(std::move(dataset)) {}
  // Megatron never reads past the end (the split was sized for the run); wrapping keeps the
  // SampleSource contract (any index >= 0) for callers that evaluate more than planned.
  void sample(int64_t index, int64_t* out) const override { dataset_->sample(index % dataset_->size(), out); }
  std::string describe() const override { return dataset_->describe(); }
  const SequenceDataset& dataset() const { return *dataset_; }

 private:
  std::shared_ptr<SequenceDataset> dataset_;
};

// The source for one split, or nullptr where the split has weight zero (or zero samples).
std::unique_ptr<SampleSource> make_gpt_sample_source(const GPTDataOptions& options, Split split);

}  // namespace megatron
