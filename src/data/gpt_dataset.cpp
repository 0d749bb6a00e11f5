// GPTDataset: split ranges, the document / sample / shuffle index builders, the index cache and
// sample reads; see gpt_dataset.h for what each index holds.
#include "data/gpt_dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <cstring>

#include "core/errors.h"
#include "core/files.h"

namespace megatron {
namespace {

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Python's round(): halves go to the even neighbour (std::nearbyint under the default rounding).
int64_t python_round(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

std::vector<unsigned char> narrow_to_bytes(const std::vector<int64_t>& v, NpyDType dtype) {
  std::vector<unsigned char> out(v.size() * npy_itemsize(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dtype) {
      case NpyDType::kInt16: { const int16_t x = static_cast<int16_t>(v[i]); std::memcpy(&out[2 * i], &x, 2); break; }
      case NpyDType::kInt32: { const int32_t x = static_cast<int32_t>(v[i]); std::memcpy(&out[4 * i], &x, 4); break; }
      case NpyDType::kUInt32: { const uint32_t x = static_cast<uint32_t>(v[i]); std::memcpy(&out[4 * i], &x, 4); break; }
      case NpyDType::kInt64: std::memcpy(&out[8 * i], &v[i], 8); break;
    }
  }
  return out;
}

}  // namespace

const char* split_name(Split split) {
  static const char* names[] = {"train", "valid", "test"};
  return names[static_cast<int>(split)];
}

SplitMatrix parse_split_matrix(const std::string& split) {
  // Megatron reads every run of digits and dots as a number and ignores everything else.
  std::vector<double> parts;
  for (size_t p = 0; p < split.size();) {
    if (!(std::isdigit(static_cast<unsigned char>(split[p])) || split[p] == '.')) {
      ++p;
      continue;
    }
    size_t q = p;
    while (q < split.size() && (std::isdigit(static_cast<unsigned char>(split[q])) || split[q] == '.')) ++q;
    const std::string token = split.substr(p, q - p);
    char* end = nullptr;
    const double v = std::strtod(token.c_str(), &end);
    if (end != token.c_str() + token.size()) {
      throw UserError("--split '" + split + "': '" + token + "' is not a number; expected e.g. 969,30,1");
    }
    parts.push_back(v);
    p = q;
  }
  if (parts.empty() || parts.size() > 3) {
    throw UserError("--split '" + split + "': expected one to three numbers (train, valid, test), e.g. 969,30,1");
  }
  parts.resize(3, 0.0);
  if (parts[0] + parts[1] + parts[2] <= 0) throw UserError("--split '" + split + "': the numbers must not all be zero");
  const std::vector<double> w = numpy_normalize(parts);
  // Cumulative bounds summed left to right in float64, as Megatron's reduce does.
  const double bounds[4] = {0.0, w[0], w[0] + w[1], (w[0] + w[1]) + w[2]};
  SplitMatrix m;
  for (int i = 0; i < 3; ++i) {
    if (bounds[i + 1] > bounds[i]) m[static_cast<size_t>(i)] = std::make_pair(bounds[i], bounds[i + 1]);
  }
  return m;
}

std::optional<std::pair<int64_t, int64_t>> split_sequence_range(const SplitMatrix& matrix, Split split,
                                                                int64_t num_sequences) {
  const auto& bookends = matrix[static_cast<size_t>(split)];
  if (!bookends) return std::nullopt;
  const double n = static_cast<double>(num_sequences);
  return std::make_pair(python_round(bookends->first * n), python_round(bookends->second * n));
}

int64_t gpt_num_epochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples, int64_t seq_length) {
  if (!num_samples) return 1;
  const int64_t requested = *num_samples * seq_length + 1;  // +1: the extra label token
  if (tokens_per_epoch <= 0) throw std::invalid_argument("gpt_num_epochs: empty epoch");
  return std::max<int64_t>(1, (requested + tokens_per_epoch - 1) / tokens_per_epoch);
}

bool gpt_separate_final_epoch(int64_t tokens_per_epoch, int64_t num_epochs, std::optional<int64_t> num_samples,
                              int64_t seq_length) {
  if (num_epochs == 1 || !num_samples) return false;
  const int64_t sans_final = ((num_epochs - 1) * tokens_per_epoch - 1) / seq_length;
  const int64_t from_final = *num_samples - sans_final;
  const int64_t per_epoch = (tokens_per_epoch - 1) / seq_length;
  // Megatron: from_final < int(0.80 * per_epoch), the product in float64 then truncated.
  return from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
}

std::vector<int32_t> build_document_index(const std::vector<int32_t>& ids, int64_t num_epochs,
                                          NumpyRandomState& rng, bool separate_final_epoch) {
  if (separate_final_epoch && num_epochs > 1) {
    std::vector<int32_t> first = build_document_index(ids, num_epochs - 1, rng, false);
    const std::vector<int32_t> last = build_document_index(ids, 1, rng, false);
    first.insert(first.end(), last.begin(), last.end());
    return first;
  }
  std::vector<int32_t> index;
  index.reserve(ids.size() * static_cast<size_t>(num_epochs));
  for (int64_t e = 0; e < num_epochs; ++e) index.insert(index.end(), ids.begin(), ids.end());
  rng.shuffle(index);
  return index;
}

std::vector<int64_t> build_sample_index(const PackedArrayView<int32_t>& lengths,
                                        const std::vector<int32_t>& document_index, int64_t seq_length,
                                        int64_t num_epochs, int64_t tokens_per_epoch) {
  // Walks the concatenated documents in seq_length steps; each sample needs seq_length + 1 tokens
  // and the next one starts on the last of them.
  const int64_t num_samples = (num_epochs * tokens_per_epoch - 1) / seq_length;
  std::vector<int64_t> out;
  out.reserve(2 * static_cast<size_t>(num_samples + 1));
  int64_t pos = 0, offset = 0;
  out.push_back(pos);
  out.push_back(offset);
  const int64_t last = static_cast<int64_t>(document_index.size()) - 1;
  for (int64_t s = 1; s <= num_samples; ++s) {
    int64_t remaining = seq_length + 1;
    while (remaining != 0) {
      const int64_t doc_length = lengths[static_cast<size_t>(document_index[static_cast<size_t>(pos)])] - offset;
      remaining -= doc_length;
      if (remaining <= 0) {
        offset += remaining + doc_length - 1;
        remaining = 0;
      } else if (pos == last) {
        // Out of documents: only the final sample can get here, ending on the last token.
        offset = lengths[static_cast<size_t>(document_index[static_cast<size_t>(pos)])] - 1;
        break;
      } else {
        ++pos;
        offset = 0;
      }
    }
    out.push_back(pos);
    out.push_back(offset);
  }
  return out;
}

std::vector<int64_t> build_shuffle_index(int64_t num_samples, int64_t total, NumpyRandomState& rng) {
  std::vector<int64_t> index(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) index[static_cast<size_t>(i)] = i;
  rng.shuffle(index.data(), static_cast<size_t>(num_samples));
  if (total > num_samples) rng.shuffle(index.data() + num_samples, static_cast<size_t>(total - num_samples));
  return index;
}

std::string fnv1a_hex(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> dataset, Split split, std::pair<int64_t, int64_t> range,
                       std::optional<int64_t> num_samples, const GPTDatasetConfig& config)
    : dataset_(std::move(dataset)), split_(split), range_(range), num_samples_(num_samples), config_(config) {
  const std::string where = "--data-path " + dataset_->path_prefix() + " (" + split_name(split) + " split)";
  if (config_.seq_length < 2) throw UserError("--seq-length must be at least 2 for a GPT dataset");
  if (config_.seed < 0 || config_.seed > int64_t{0xffffffff}) {
    throw UserError("--seed " + std::to_string(config_.seed) + ": the dataset shuffle needs a seed in [0, 2^32)");
  }
  if (dataset_->num_sequences() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw UserError(where + ": more than 2^31 - 1 sequences; Megatron's int32 document index cannot address them");
  }
  if (range_.first < 0 || range_.second > static_cast<int64_t>(dataset_->num_sequences()) ||
      range_.first > range_.second) {
    throw std::invalid_argument("GPTDataset: sequence range outside the dataset");
  }
  auto lengths = dataset_->sequence_lengths();
  for (int64_t s = range_.first; s < range_.second; ++s) tokens_per_epoch_ += lengths[static_cast<size_t>(s)];
  if (tokens_per_epoch_ < 2) {
    throw UserError(where + ": sequences [" + std::to_string(range_.first) + ", " + std::to_string(range_.second) +
                    ") hold " + std::to_string(tokens_per_epoch_) +
                    " tokens, too few to draw samples from; use more data or change --split");
  }
  if (num_samples_ && *num_samples_ < 0) throw std::invalid_argument("GPTDataset: negative num_samples");
  num_epochs_ = gpt_num_epochs(tokens_per_epoch_, num_samples_, config_.seq_length);
  separate_final_epoch_ = gpt_separate_final_epoch(tokens_per_epoch_, num_epochs_, num_samples_, config_.seq_length);

  std::ostringstream d;
  d << "{\n    \"class\": \"GPTDataset\",\n    \"format\": 1,\n    \"dataset_path\": \"" << dataset_->path_prefix()
    << "\",\n    \"num_sequences\": " << dataset_->num_sequences() << ",\n    \"num_tokens\": "
    << dataset_->num_tokens() << ",\n    \"num_samples\": "
    << (num_samples_ ? std::to_string(*num_samples_) : std::string("null")) << ",\n    \"index_split\": \""
    << split_name(split_) << "\",\n    \"sequence_range\": [" << range_.first << ", " << range_.second
    << "],\n    \"random_seed\": " << config_.seed << ",\n    \"sequence_length\": " << config_.seq_length
    << ",\n    \"add_extra_token_to_sequence\": true,\n    \"drop_last_partial_sequence\": true\n}";
  description_ = d.str();

  if (config_.use_cache) {
    const std::string dir = config_.cache_dir.empty() ? dataset_->path_prefix() + "/cache/GPTDataset_indices"
                                                      : config_.cache_dir;
    cache_base_ = dir + "/" + fnv1a_hex(description_) + "-GPTDataset-" + split_name(split_);
  }
  if (!try_load()) build();
}

std::string GPTDataset::cache_path(const std::string& suffix) const { return cache_base_ + "-" + suffix; }

bool GPTDataset::try_load() {
  if (!config_.use_cache || !file_exists(cache_path("description.txt"))) return false;
  const std::string stale = read_text(cache_path("description.txt"));
  try {
    if (stale != description_) throw std::runtime_error("its description does not match this dataset's parameters");
    document_index_ = NpyArray::map_file(cache_path("document_index.npy"));
    sample_index_ = NpyArray::map_file(cache_path("sample_index.npy"));
    shuffle_index_ = NpyArray::map_file(cache_path("shuffle_index.npy"));
    validate_loaded();
  } catch (const std::exception& e) {
    std::cerr << "warning: ignoring the " << split_name(split_) << " index cache " << cache_base_
              << "-*: " << e.what() << "; rebuilding it\n";
    document_index_ = sample_index_ = shuffle_index_ = NpyArray();
    return false;
  }
  loaded_from_cache_ = true;
  if (config_.verbose) std::cerr << "loaded the GPTDataset " << split_name(split_) << " indices from " << cache_base_ << "-*\n";
  return true;
}

void GPTDataset::validate_loaded() const {
  // Everything sample() indexes with is range-checked here, so a damaged cache is rebuilt at
  // startup rather than read out of bounds mid-run.
  auto fail = [](const std::string& what) { throw std::runtime_error(what); };
  const size_t docs = static_cast<size_t>(range_.second - range_.first) * static_cast<size_t>(num_epochs_);
  const int64_t n = (num_epochs_ * tokens_per_epoch_ - 1) / config_.seq_length;
  const NpyArray& di = document_index_;
  const NpyArray& si = sample_index_;
  const NpyArray& sh = shuffle_index_;
  if (di.dtype() != NpyDType::kInt32 || di.shape() != std::vector<size_t>{docs}) fail("document index has the wrong dtype or shape");
  if ((si.dtype() != NpyDType::kInt32 && si.dtype() != NpyDType::kInt64) ||
      si.shape() != std::vector<size_t>{static_cast<size_t>(n + 1), 2}) {
    fail("sample index has the wrong dtype or shape");
  }
  if ((sh.dtype() != NpyDType::kUInt32 && sh.dtype() != NpyDType::kInt64) ||
      sh.shape() != std::vector<size_t>{static_cast<size_t>(n)}) {
    fail("shuffle index has the wrong dtype or shape");
  }
  for (size_t i = 0; i < docs; ++i) {
    if (di[i] < range_.first || di[i] >= range_.second) fail("document index entry out of the split's range");
  }
  auto lengths = dataset_->sequence_lengths();
  int64_t prev = 0;
  for (size_t r = 0; r <= static_cast<size_t>(n); ++r) {
    const int64_t pos = si[2 * r], off = si[2 * r + 1];
    if (pos < prev || pos >= static_cast<int64_t>(docs)) fail("sample index position out of range");
    if (off < 0 || off >= std::max<int64_t>(1, lengths[static_cast<size_t>(di[static_cast<size_t>(pos)])])) {
      fail("sample index offset outside its document");
    }
    prev = pos;
  }
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    if (sh[i] < 0 || sh[i] >= n) fail("shuffle index entry out of range");
  }
}

void GPTDataset::build() {
  NumpyRandomState rng(config_.seed);
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(range_.second - range_.first));
  for (int64_t s = range_.first; s < range_.second; ++s) ids.push_back(static_cast<int32_t>(s));
  const std::vector<int32_t> documents = build_document_index(ids, num_epochs_, rng, separate_final_epoch_);
  const std::vector<int64_t> samples =
      build_sample_index(dataset_->sequence_lengths(), documents, config_.seq_length, num_epochs_, tokens_per_epoch_);
  const int64_t n = static_cast<int64_t>(samples.size() / 2) - 1;
  int64_t sans_final = n;
  if (separate_final_epoch_) sans_final = ((num_epochs_ - 1) * tokens_per_epoch_ - 1) / config_.seq_length;
  const std::vector<int64_t> shuffle = build_shuffle_index(sans_final, n, rng);

  // Megatron's dtypes: int32 sample index while positions and lengths fit; uint32 shuffle index
  // below 2^32 - 2 samples.
  int64_t max_length = 0;
  auto lengths = dataset_->sequence_lengths();
  for (size_t s = 0; s < lengths.size(); ++s) max_length = std::max<int64_t>(max_length, lengths[s]);
  const int64_t sample_max = std::max<int64_t>(static_cast<int64_t>(documents.size()), max_length);
  const NpyDType sample_dtype = sample_max <= std::numeric_limits<int32_t>::max() ? NpyDType::kInt32 : NpyDType::kInt64;
  const NpyDType shuffle_dtype = n >= int64_t{0xffffffff} - 1 ? NpyDType::kInt64 : NpyDType::kUInt32;
  std::vector<unsigned char> doc_bytes(documents.size() * 4);
  if (!documents.empty()) std::memcpy(doc_bytes.data(), documents.data(), doc_bytes.size());
  document_index_ = NpyArray(NpyDType::kInt32, {documents.size()}, std::move(doc_bytes));
  sample_index_ = NpyArray(sample_dtype, {static_cast<size_t>(n + 1), 2}, narrow_to_bytes(samples, sample_dtype));
  shuffle_index_ = NpyArray(shuffle_dtype, {static_cast<size_t>(n)}, narrow_to_bytes(shuffle, shuffle_dtype));
  if (config_.verbose) {
    std::cerr << "built the GPTDataset " << split_name(split_) << " indices: " << n << " samples, " << num_epochs_
              << " epoch(s)" << (separate_final_epoch_ ? ", final epoch shuffled separately" : "") << "\n";
  }
  if (!config_.use_cache) return;
  try {
    make_directories(cache_base_.substr(0, cache_base_.rfind('/')));
    for (const auto& [suffix, array] : {std::make_pair("document_index.npy", &document_index_),
                                        std::make_pair("sample_index.npy", &sample_index_),
                                        std::make_pair("shuffle_index.npy", &shuffle_index_)}) {
      write_npy_atomic(cache_path(suffix), array->dtype(), array->shape(), array->bytes());
    }
    // The description goes last: it marks the cache complete.
    write_file_atomic(cache_path("description.txt"), description_);
  } catch (const std::exception& e) {
    throw UserError(std::string("cannot write the dataset index cache: ") + e.what() +
                    "; pass --data-cache-path with a writable directory");
  }
}

void GPTDataset::sample(int64_t index, int64_t* out) const {
  if (index < 0 || index >= size()) throw std::out_of_range("GPTDataset::sample: index out of range");
  const size_t j = static_cast<size_t>(shuffle_index_[static_cast<size_t>(index)]);
  const int64_t first = sample_index_[2 * j], first_offset = sample_index_[2 * j + 1];
  const int64_t last = sample_index_[2 * j + 2], last_offset = sample_index_[2 * j + 3];
  const int64_t want = config_.seq_length + 1;
  int64_t filled = 0;
  for (int64_t p = first; p <= last; ++p) {
    const size_t seq = static_cast<size_t>(document_index_[static_cast<size_t>(p)]);
    const int64_t offset = p == first ? first_offset : 0;
    // The last piece ends on the next sample's first token (inclusive).
    const int64_t count = p == last ? last_offset + 1 - offset : dataset_->sequence_length(seq) - offset;
    if (count < 0 || filled + count > want || offset + count > dataset_->sequence_length(seq)) break;
    dataset_->read_tokens(seq, static_cast<size_t>(offset), static_cast<size_t>(count), out + filled);
    filled += count;
  }
  if (filled != want) {
    throw UserError("sample " + std::to_string(index) + " of " + describe() + " spans " + std::to_string(filled) +
                    " tokens instead of " + std::to_string(want) + "; the index cache " + cache_base_ +
                    "-* is damaged: delete it to rebuild");
  }
}

std::vector<int64_t> GPTDataset::sample_sequence_ids(int64_t index) const {
  if (index < 0 || index >= size()) throw std::out_of_range("GPTDataset::sample_sequence_ids: index out of range");
  const size_t j = static_cast<size_t>(shuffle_index_[static_cast<size_t>(index)]);
  std::vector<int64_t> ids;
  for (int64_t p = sample_index_[2 * j]; p <= sample_index_[2 * j + 2]; ++p) {
    ids.push_back(document_index_[static_cast<size_t>(p)]);
  }
  return ids;
}

std::string GPTDataset::describe() const {
  std::ostringstream d;
  d << dataset_->path_prefix() << " (" << split_name(split_) << ": sequences " << range_.first << ".." << range_.second
    << ", " << tokens_per_epoch_ << " tokens, " << size() << " samples, " << num_epochs_ << " epoch(s))";
  return d.str();
}

}  // namespace megatron
