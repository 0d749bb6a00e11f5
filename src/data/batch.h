// Assembling micro-batches from a SampleSource.
#pragma once

#include "data/samples.h"
#include "model/gpt_model.h"

namespace megatron {

// Samples [first, first + micro_batch) -> Batch with tokens/labels [b, s] and an all-ones mask.
// A token id outside [0, vocab_size) is bad data: UserError naming the sample.
Batch make_batch(const SampleSource& source, int64_t first, int64_t micro_batch, int64_t seq_length,
                 int64_t vocab_size);

}  // namespace megatron
