// Blends of GPTDatasets and the per-split build decisions; see blended_dataset.h.
#include "data/blended_dataset.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "core/errors.h"
#include "core/files.h"
#include "core/text.h"

namespace megatron {
namespace {

// Python's float(text) for the forms a weight takes; false where Python would raise.
bool parse_python_float(const std::string& text, double* out) {
  const std::string t = strip_whitespace(text);
  if (t.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size();
}

std::string format_double(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", x);
  return buf;
}

}  // namespace

DataBlend parse_data_path(const std::vector<std::string>& data_path, const std::string& flag) {
  if (data_path.empty()) throw UserError(flag + ": no dataset given");
  DataBlend blend;
  if (data_path.size() % 2 == 0) {
    std::vector<double> weights;
    bool all_numbers = true;
    for (size_t i = 0; i < data_path.size(); i += 2) {
      double w = 0;
      if (!parse_python_float(data_path[i], &w)) {
        all_numbers = false;
        break;
      }
      weights.push_back(w);
    }
    if (all_numbers) {
      for (size_t i = 1; i < data_path.size(); i += 2) blend.prefixes.push_back(strip_whitespace(data_path[i]));
      for (size_t i = 0; i < weights.size(); ++i) {
        if (!(weights[i] > 0) || !std::isfinite(weights[i])) {
          throw UserError(flag + ": weight '" + data_path[2 * i] + "' of " + blend.prefixes[i] +
                          " must be a positive number");
        }
      }
      blend.weights = weights;
      return blend;
    }
  }
  for (const auto& p : data_path) blend.prefixes.push_back(strip_whitespace(p));
  return blend;
}

std::array<int64_t, 3> megatron_split_num_samples(int64_t train_iters, int64_t gbs, int64_t eval_interval,
                                                  int64_t eval_iters) {
  const int64_t evals = eval_interval > 0 ? train_iters / eval_interval + 1 : 1;
  return {train_iters * gbs, evals * eval_iters * gbs, eval_iters * gbs};
}

int64_t blend_dataset_share(double w, int64_t target, double surplus) {
  // Python: int(math.ceil(math.ceil(target * w) * (1 + surplus))), every product in float64.
  const double share = std::ceil(static_cast<double>(target) * w);
  return static_cast<int64_t>(std::ceil(share * (1.0 + surplus)));
}

void build_blending_indices(const std::vector<double>& weights, int64_t size, std::vector<int16_t>* dataset_index,
                            std::vector<int64_t>* dataset_sample_index) {
  const size_t k = weights.size();
  std::vector<int64_t> taken(k, 0);
  dataset_index->assign(static_cast<size_t>(size), 0);
  dataset_sample_index->assign(static_cast<size_t>(size), 0);
  for (int64_t s = 0; s < size; ++s) {
    // Give the sample to the dataset furthest behind its share so far.
    const double progress = std::max(static_cast<double>(s), 1.0);
    size_t best = 0;
    double best_error = weights[0] * progress - static_cast<double>(taken[0]);
    for (size_t i = 1; i < k; ++i) {
      const double error = weights[i] * progress - static_cast<double>(taken[i]);
      if (error > best_error) {
        best_error = error;
        best = i;
      }
    }
    (*dataset_index)[static_cast<size_t>(s)] = static_cast<int16_t>(best);
    (*dataset_sample_index)[static_cast<size_t>(s)] = taken[best]++;
  }
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<GPTDataset>> datasets, const std::vector<double>& weights,
                               int64_t size, const std::string& cache_dir)
    : datasets_(std::move(datasets)), weights_(numpy_normalize(weights)), size_(size) {
  if (datasets_.empty() || datasets_.size() != weights.size() || datasets_.size() >= 32767) {
    throw std::invalid_argument("BlendedDataset: need 1..32766 datasets with one weight each");
  }
  std::ostringstream d;
  d << "{\n    \"class\": \"BlendedDataset\",\n    \"format\": 1,\n    \"datasets\": [";
  for (size_t i = 0; i < datasets_.size(); ++i) d << (i ? ",\n" : "\n") << datasets_[i]->description();
  d << "\n    ],\n    \"split\": \"" << split_name(datasets_[0]->split()) << "\",\n    \"weights\": [";
  for (size_t i = 0; i < weights_.size(); ++i) d << (i ? ", " : "") << format_double(weights_[i]);
  d << "],\n    \"size\": " << size_ << "\n}";
  description_ = d.str();

  const std::string base = cache_dir.empty() ? std::string()
                                             : cache_dir + "/" + fnv1a_hex(description_) + "-BlendedDataset-" +
                                                   split_name(datasets_[0]->split());
  if (!base.empty() && try_load(base)) return;

  std::vector<int16_t> index;
  std::vector<int64_t> sample_index;
  build_blending_indices(weights_, size_, &index, &sample_index);
  std::vector<int64_t> counts(datasets_.size(), 0);
  for (int16_t i : index) ++counts[static_cast<size_t>(i)];
  for (size_t i = 0; i < datasets_.size(); ++i) {
    if (counts[i] > datasets_[i]->size()) {
      throw UserError("the " + std::string(split_name(datasets_[0]->split())) + " blend takes " +
                      std::to_string(counts[i]) + " samples from " + datasets_[i]->describe() +
                      ", more than it holds; give that dataset more data or a smaller weight");
    }
  }
  std::vector<unsigned char> ib(index.size() * 2), sb(sample_index.size() * 8);
  if (!index.empty()) std::memcpy(ib.data(), index.data(), ib.size());
  if (!sample_index.empty()) std::memcpy(sb.data(), sample_index.data(), sb.size());
  dataset_index_ = NpyArray(NpyDType::kInt16, {index.size()}, std::move(ib));
  dataset_sample_index_ = NpyArray(NpyDType::kInt64, {sample_index.size()}, std::move(sb));
  if (base.empty()) return;
  try {
    make_directories(cache_dir);
    write_npy_atomic(base + "-dataset_index.npy", NpyDType::kInt16, dataset_index_.shape(), dataset_index_.bytes());
    write_npy_atomic(base + "-dataset_sample_index.npy", NpyDType::kInt64, dataset_sample_index_.shape(),
                     dataset_sample_index_.bytes());
    write_file_atomic(base + "-description.txt", description_);
  } catch (const std::exception& e) {
    throw UserError(std::string("cannot write the blend index cache: ") + e.what() +
                    "; pass --data-cache-path with a writable directory");
  }
}

bool BlendedDataset::try_load(const std::string& base) {
  struct stat st {};
  if (::stat((base + "-description.txt").c_str(), &st) != 0) return false;
  std::ifstream in(base + "-description.txt", std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  try {
    if (text.str() != description_) throw std::runtime_error("its description does not match this blend");
    dataset_index_ = NpyArray::map_file(base + "-dataset_index.npy");
    dataset_sample_index_ = NpyArray::map_file(base + "-dataset_sample_index.npy");
    validate_loaded();
  } catch (const std::exception& e) {
    std::cerr << "warning: ignoring the blend index cache " << base << "-*: " << e.what() << "; rebuilding it\n";
    dataset_index_ = dataset_sample_index_ = NpyArray();
    return false;
  }
  loaded_from_cache_ = true;
  return true;
}

void BlendedDataset::validate_loaded() const {
  const std::vector<size_t> shape{static_cast<size_t>(size_)};
  if (dataset_index_.dtype() != NpyDType::kInt16 || dataset_index_.shape() != shape ||
      dataset_sample_index_.dtype() != NpyDType::kInt64 || dataset_sample_index_.shape() != shape) {
    throw std::runtime_error("an index has the wrong dtype or shape");
  }
  for (size_t s = 0; s < static_cast<size_t>(size_); ++s) {
    const int64_t i = dataset_index_[s], j = dataset_sample_index_[s];
    if (i < 0 || i >= static_cast<int64_t>(datasets_.size()) || j < 0 || j >= datasets_[static_cast<size_t>(i)]->size()) {
      throw std::runtime_error("an index entry is out of range");
    }
  }
}

void BlendedDataset::sample(int64_t index, int64_t* out) const {
  if (index < 0 || index >= size_) throw std::out_of_range("BlendedDataset::sample: index out of range");
  const size_t s = static_cast<size_t>(index);
  datasets_[static_cast<size_t>(dataset_index_[s])]->sample(dataset_sample_index_[s], out);
}

std::string BlendedDataset::describe() const {
  std::ostringstream d;
  d << "blend of " << datasets_.size() << " datasets (" << split_name(datasets_[0]->split()) << ", " << size_
    << " samples):";
  for (size_t i = 0; i < datasets_.size(); ++i) d << " " << format_double(weights_[i]) << " " << datasets_[i]->describe();
  return d.str();
}

namespace {

// What BlendedMegatronDatasetBuilder builds for one split from `blend`: a GPTDataset when
// `one_dataset` (one prefix: unweighted under --data-path, weighted or not per split), else a
// BlendedDataset. `range_of` gives each indexed dataset's sequence range for the split; `flag`
// names where the prefixes came from, for errors.
std::shared_ptr<SequenceDataset> build_split_blend(const DataBlend& blend, bool one_dataset, Split split, int64_t num_samples,
                                                   const GPTDatasetConfig& config, const std::string& flag,
                                                   const std::function<std::pair<int64_t, int64_t>(const IndexedDataset&)>& range_of) {
  auto open = [&](const std::string& prefix) {
    auto ds = std::make_shared<const IndexedDataset>(prefix);
    const auto range = range_of(*ds);
    return std::make_pair(ds, range);
  };
  if (one_dataset) {
    auto [ds, range] = open(blend.prefixes[0]);
    return std::make_shared<GPTDataset>(ds, split, range, num_samples, config);
  }
  std::vector<std::shared_ptr<GPTDataset>> parts;
  std::vector<double> weights;
  int64_t size = 0;
  if (blend.weights) {
    // Normalised once here and once more inside the blend, as Megatron does.
    const std::vector<double> w = numpy_normalize(*blend.weights);
    for (size_t i = 0; i < blend.prefixes.size(); ++i) {
      auto [ds, range] = open(blend.prefixes[i]);
      parts.push_back(std::make_shared<GPTDataset>(ds, split, range, blend_dataset_share(w[i], num_samples, 0.005), config));
      size += blend_dataset_share(w[i], num_samples, 0.0);
    }
    weights = w;
  } else {
    // Unweighted: one epoch of each, weighted by its sample count.
    int64_t total = 0;
    for (const auto& prefix : blend.prefixes) {
      auto [ds, range] = open(prefix);
      parts.push_back(std::make_shared<GPTDataset>(ds, split, range, std::nullopt, config));
      if (parts.back()->size() == 0) {
        // Megatron asserts here (a blend weight must be positive); say why instead.
        throw UserError(flag + " " + prefix + ": its " + split_name(split) +
                        " data is shorter than one sample, so it cannot be weighted by its size in an "
                        "unweighted blend; give weights or use more data" +
                        (flag == "--data-path" ? " or change --split" : ""));
      }
      weights.push_back(static_cast<double>(parts.back()->size()));
      total += parts.back()->size();
    }
    size = std::min(num_samples, total);
  }
  // Megatron caches blends only under an explicit --data-cache-path.
  const std::string blend_cache = config.use_cache ? config.cache_dir : std::string();
  return std::make_shared<BlendedDataset>(std::move(parts), weights, size, blend_cache);
}

}  // namespace

std::shared_ptr<SequenceDataset> build_gpt_split_dataset(const std::vector<std::string>& data_path,
                                                         const std::string& split_string, Split split,
                                                         int64_t num_samples, const GPTDatasetConfig& config) {
  const DataBlend blend = parse_data_path(data_path, "--data-path");
  const SplitMatrix matrix = parse_split_matrix(split_string);
  if (!matrix[static_cast<size_t>(split)]) return nullptr;
  const bool one_dataset = blend.prefixes.size() == 1 && !blend.weights;
  return build_split_blend(blend, one_dataset, split, num_samples, config, "--data-path", [&](const IndexedDataset& ds) {
    return *split_sequence_range(matrix, split, static_cast<int64_t>(ds.num_sequences()));
  });
}

std::shared_ptr<SequenceDataset> build_gpt_own_split_dataset(const std::vector<std::string>& split_data_path, Split split,
                                                             int64_t num_samples, const GPTDatasetConfig& config) {
  if (split_data_path.empty()) return nullptr;
  const std::string flag = std::string("--") + split_name(split) + "-data-path";
  const DataBlend blend = parse_data_path(split_data_path, flag);
  // Megatron takes a lone prefix as it is here, weighted or not (a --data-path weight makes a
  // one-dataset blend).
  const bool one_dataset = blend.prefixes.size() == 1;
  return build_split_blend(blend, one_dataset, split, num_samples, config, flag, [](const IndexedDataset& ds) {
    return std::make_pair(int64_t{0}, static_cast<int64_t>(ds.num_sequences()));
  });
}

}  // namespace megatron
