#include "data/samples.h"

#include <vector>

#include "data/gpt_sample_source.h"
#include "data/sft_samples.h"

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

}  // namespace

LtorSample SampleSource::ltor_sample(int64_t index, int64_t seq_length, const LtorOptions& options) const {
  std::vector<int64_t> text(static_cast<size_t>(seq_length + 1));
  sample(index, text.data());
  return make_ltor_sample(text.data(), seq_length, options);
}

std::unique_ptr<SampleSource> make_sample_source(const Config& c, Split split) {
  const int64_t eod = c.data.eod_id;
  if (c.data.mock_data) {
    // Each split draws from its own stream of synthetic documents.
    const uint64_t seed = static_cast<uint64_t>(c.train.seed) * 3 + static_cast<uint64_t>(split);
    return std::make_unique<MockSamples>(seed, c.model.vocab_size, eod, c.model.seq_length);
  }
  if (c.data.sft) return make_sft_sample_source(c, split);
  return make_gpt_sample_source(gpt_data_options(c, c.data.data_cache_path), split);
}

}  // namespace megatron
