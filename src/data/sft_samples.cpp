#include "data/sft_samples.h"

#include <cmath>
#include <numeric>
#include <sstream>

#include "core/errors.h"
#include "data/gpt_dataset.h"
#include "data/numpy_random.h"
#include "data/sft_dataset.h"

namespace megatron {
namespace {

class SftSamples : public SampleSource {
 public:
  SftSamples(std::shared_ptr<SftDataset> dataset, int64_t begin, int64_t end, int64_t seed, std::string describe)
      : dataset_(std::move(dataset)), begin_(begin), count_(end - begin), seed_(seed), describe_(std::move(describe)) {}

  LtorSample ltor_sample(int64_t index, int64_t seq_length, const LtorOptions& options) const override {
    return dataset_->get(static_cast<size_t>(pack_of(index)));
  }

  void sample(int64_t index, int64_t* out) const override {
    std::vector<int64_t> tokens;
    dataset_->read_pack(static_cast<size_t>(pack_of(index)), &tokens, nullptr, nullptr);
    std::copy(tokens.begin(), tokens.end(), out);
  }

  bool packed() const override { return true; }
  std::string describe() const override { return describe_; }

 private:
  // Epoch e visits the split's packs in the order of a numpy RandomState(seed + e) shuffle.
  int64_t pack_of(int64_t index) const {
    const int64_t epoch = index / count_;
    if (epoch != cached_epoch_) {
      order_.resize(static_cast<size_t>(count_));
      std::iota(order_.begin(), order_.end(), begin_);
      NumpyRandomState rng(seed_ + epoch);
      rng.shuffle(order_);
      cached_epoch_ = epoch;
    }
    return order_[static_cast<size_t>(index % count_)];
  }

  std::shared_ptr<SftDataset> dataset_;
  int64_t begin_, count_, seed_;
  std::string describe_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> order_;
};

}  // namespace

std::unique_ptr<SampleSource> make_sft_sample_source(const Config& c, Split split) {
  // Per-split paths (Pai-Megatron-Patch's --train-data-path / --valid-data-path): each split is
  // its own packed dataset, whole.
  const std::vector<std::string>* own[] = {&c.data.train_data_path, &c.data.valid_data_path, &c.data.test_data_path};
  const std::vector<std::string>& paths = c.data.per_split_data() ? *own[static_cast<int>(split)] : c.data.data_path;
  const std::string flag = c.data.per_split_data() ? std::string("--") + split_name(split) + "-data-path" : "--data-path";
  if (paths.empty()) return nullptr;
  if (paths.size() != 1) {
    throw UserError("--sft: pass one " + flag + ", the --output-prefix given to `megatron preprocess --sft` (blends of packed "
                    "datasets are not supported)");
  }
  const std::string& prefix = paths[0];
  auto dataset = std::make_shared<SftDataset>(prefix, c.model.seq_length, c.data.eod_id);
  const int64_t packs = static_cast<int64_t>(dataset->size());
  const auto range = c.data.per_split_data() ? std::make_optional(std::make_pair(int64_t{0}, packs))
                                             : split_sequence_range(parse_split_matrix(c.data.split), split, packs);
  if (!range || range->second <= range->first) return nullptr;
  std::ostringstream d;
  d << prefix << " (packed SFT, " << split_name(split) << ": packs " << range->first << ".." << range->second
    << " of " << packs << ")";
  return std::make_unique<SftSamples>(dataset, range->first, range->second, c.train.seed, d.str());
}

}  // namespace megatron
