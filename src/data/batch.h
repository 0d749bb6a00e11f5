// Assembling micro-batches from a SampleSource, with Megatron's left-to-right masks.
#pragma once

#include "core/config.h"
#include "data/ltor_masks.h"
#include "data/micro_batch.h"
#include "data/samples.h"

namespace megatron {

LtorOptions ltor_options(const Config& config);

// Samples [first, first + micro_batch) -> Batch: tokens/labels/loss_mask [b, s]; position_ids
// with --reset-position-ids and an attention mask with --reset-attention-mask (else undefined:
// positions 0..s-1 and plain causal attention). A token id outside [0, vocab_size) is bad data:
// UserError naming the sample.
Batch make_batch(const SampleSource& source, int64_t first, int64_t micro_batch, int64_t seq_length,
                 int64_t vocab_size, const LtorOptions& options);

}  // namespace megatron
