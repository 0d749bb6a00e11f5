// Training samples: fixed-length token windows (seq_length + 1 tokens: inputs and the labels
// shifted by one) addressed by a global sample index, so the data position of a run is just
// the number of samples consumed and a resumed run sees exactly the samples it would have.
//
// Sources: --mock-data (synthetic documents, here) and --data-path (Megatron's GPTDataset and
// blending, in gpt_sample_source.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/ltor_masks.h"

namespace megatron {

enum class Split { Train = 0, Valid = 1, Test = 2 };

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Writes seq_length + 1 token ids of sample `index` (any index >= 0; sources wrap around).
  virtual void sample(int64_t index, int64_t* out) const = 0;
  virtual std::string describe() const = 0;
  // Inputs, labels, loss mask, positions and document boundaries of sample `index`. By default
  // Megatron's left-to-right rules over sample(); sources with their own masks (packed SFT
  // data) override it.
  virtual LtorSample ltor_sample(int64_t index, int64_t seq_length, const LtorOptions& options) const;
  // Whether samples carry their own per-document positions and boundaries (packed sequences).
  virtual bool packed() const { return false; }
};

// The source of one split; nullptr when the split is empty (no validation / test data).
std::unique_ptr<SampleSource> make_sample_source(const Config& config, Split split);

}  // namespace megatron
