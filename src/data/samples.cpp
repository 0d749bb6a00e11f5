#include "data/samples.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <sstream>

#include "core/errors.h"
#include "data/indexed_dataset.h"

namespace megatron {
namespace {

// SplitMix64: a tiny, well-mixed hash so each mock sample is a pure function of (seed, index).
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Synthetic documents in the spirit of Megatron's MockGPTDataset: runs of consecutive token ids
// of random length and start, each closed by the end-of-document id. Learnable (the next token
// is usually the current one plus one), so the loss visibly falls.
class MockSamples : public SampleSource {
 public:
  MockSamples(uint64_t seed, int64_t vocab, int64_t eod, int64_t seq_length)
      : seed_(seed), vocab_(vocab), eod_(eod), seq_length_(seq_length) {}

  void sample(int64_t index, int64_t* out) const override {
    uint64_t state = mix(seed_ ^ mix(static_cast<uint64_t>(index)));
    int64_t filled = 0;
    while (filled < seq_length_ + 1) {
      state = mix(state);
      const int64_t doc_len = 1 + static_cast<int64_t>(state % static_cast<uint64_t>(seq_length_));
      const int64_t start = static_cast<int64_t>((state >> 32) % static_cast<uint64_t>(vocab_));
      for (int64_t k = 0; k < doc_len && filled < seq_length_ + 1; ++k) out[filled++] = (start + k) % vocab_;
      if (filled < seq_length_ + 1) out[filled++] = eod_;
    }
  }

  std::string describe() const override { return "mock data (synthetic documents)"; }

 private:
  uint64_t seed_;
  int64_t vocab_, eod_, seq_length_;
};

// The documents of one split of an indexed dataset, read as one token stream; sample i is the
// window starting at token i * seq_length (consecutive samples share one token), wrapping
// around at the end of the split (a new epoch).
class IndexedStreamSamples : public SampleSource {
 public:
  IndexedStreamSamples(const std::string& prefix, std::pair<int64_t, int64_t> docs, int64_t seq_length, Split split)
      : dataset_(prefix), seq_length_(seq_length) {
    auto doc_index = dataset_.document_indices();
    const int64_t first_seq = doc_index[docs.first], end_seq = doc_index[docs.second];
    int64_t total = 0;
    for (int64_t s = first_seq; s < end_seq; ++s) {
      sequences_.push_back(s);
      starts_.push_back(total);
      total += dataset_.sequence_length(s);
    }
    total_tokens_ = total;
    static const char* names[] = {"train", "valid", "test"};
    if (total_tokens_ < seq_length_ + 1) {
      throw UserError("--data-path " + prefix + ": the " + names[int(split)] + " split holds " +
                      std::to_string(total_tokens_) + " tokens, fewer than one sample of --seq-length " +
                      std::to_string(seq_length_) + " + 1; use more data or change --split");
    }
    std::ostringstream d;
    d << prefix << " (" << names[int(split)] << ": documents " << docs.first << ".." << docs.second << ", "
      << total_tokens_ << " tokens)";
    describe_ = d.str();
  }

  void sample(int64_t index, int64_t* out) const override {
    int64_t pos = static_cast<int64_t>((static_cast<__int128>(index) * seq_length_) % total_tokens_);
    int64_t filled = 0;
    while (filled < seq_length_ + 1) {
      // The sequence holding stream position `pos`.
      auto it = std::upper_bound(starts_.begin(), starts_.end(), pos) - 1;
      const size_t k = static_cast<size_t>(it - starts_.begin());
      const int64_t offset = pos - *it;
      const int64_t available = dataset_.sequence_length(sequences_[k]) - offset;
      const int64_t take = std::min(available, seq_length_ + 1 - filled);
      dataset_.read_tokens(sequences_[k], offset, take, out + filled);
      filled += take;
      pos = (pos + take) % total_tokens_;
    }
  }

  std::string describe() const override { return describe_; }

 private:
  IndexedDataset dataset_;
  int64_t seq_length_;
  std::vector<int64_t> sequences_;  // sequence ids of the split, in order
  std::vector<int64_t> starts_;     // stream position of each sequence's first token
  int64_t total_tokens_ = 0;
  std::string describe_;
};

}  // namespace

std::vector<double> parse_split(const std::string& split) {
  std::vector<double> parts;
  std::string item;
  std::istringstream in(split);
  while (std::getline(in, item, split.find(',') != std::string::npos ? ',' : '/')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    while (end && *end == ' ') ++end;
    if (item.empty() || end == nullptr || *end != '\0' || v < 0 || !std::isfinite(v)) {
      throw UserError("--split '" + split + "': expected up to three non-negative numbers like 969,30,1");
    }
    parts.push_back(v);
  }
  if (parts.empty() || parts.size() > 3) throw UserError("--split '" + split + "': expected one to three numbers");
  parts.resize(3, 0.0);
  const double sum = std::accumulate(parts.begin(), parts.end(), 0.0);
  if (sum <= 0) throw UserError("--split '" + split + "': the numbers must not all be zero");
  for (auto& p : parts) p /= sum;
  return parts;
}

std::pair<int64_t, int64_t> split_document_range(const std::vector<double>& f, Split split, int64_t n) {
  // Megatron: cumulative fractions, each boundary rounded to a document count.
  std::vector<int64_t> bounds = {0};
  double cumulative = 0;
  for (double x : f) {
    cumulative += x;
    bounds.push_back(static_cast<int64_t>(std::llround(cumulative * double(n))));
  }
  bounds.back() = n;
  const int i = static_cast<int>(split);
  return {bounds[i], bounds[i + 1]};
}

std::unique_ptr<SampleSource> make_sample_source(const Config& c, Split split) {
  const int64_t eod = c.model.vocab_size;  // NullTokenizer: end-of-document follows the vocabulary
  if (c.data.mock_data) {
    // Each split draws from its own stream of synthetic documents.
    const uint64_t seed = static_cast<uint64_t>(c.train.seed) * 3 + static_cast<uint64_t>(split);
    return std::make_unique<MockSamples>(seed, c.model.vocab_size, eod, c.model.seq_length);
  }
  if (c.data.data_path.size() != 1) {
    throw UserError("--data-path: blending several datasets (weights and prefixes) is not available yet in this "
                    "build; pass one prefix");
  }
  const std::string& prefix = c.data.data_path[0];
  auto fractions = parse_split(c.data.split);
  IndexedDataset probe(prefix);
  auto docs = split_document_range(fractions, split, static_cast<int64_t>(probe.num_documents()));
  if (docs.first == docs.second) return nullptr;  // empty split: no validation / test
  return std::make_unique<IndexedStreamSamples>(prefix, docs, c.model.seq_length, split);
}

}  // namespace megatron
