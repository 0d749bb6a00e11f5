// Training samples: fixed-length token windows (seq_length + 1 tokens: inputs and the labels
// shifted by one) addressed by a global sample index, so the data position of a run is just
// the number of samples consumed and a resumed run sees exactly the samples it would have.
//
// Sources here: --mock-data (synthetic documents) and one indexed dataset read as a plain token
// stream over the documents of its train / valid / test split. Megatron's full GPTDataset
// (shuffled document, sample and shuffle indices, blending) belongs to the data pipeline.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"

namespace megatron {

enum class Split { Train = 0, Valid = 1, Test = 2 };

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Writes seq_length + 1 token ids of sample `index` (any index >= 0; sources wrap around).
  virtual void sample(int64_t index, int64_t* out) const = 0;
  virtual std::string describe() const = 0;
};

// Megatron's split string ("969,30,1") as fractions summing to one; throws UserError if invalid.
std::vector<double> parse_split(const std::string& split);

// Document range [begin, end) of `split` among `num_documents`, as Megatron rounds it.
std::pair<int64_t, int64_t> split_document_range(const std::vector<double>& fractions, Split split,
                                                 int64_t num_documents);

std::unique_ptr<SampleSource> make_sample_source(const Config& config, Split split);

}  // namespace megatron
