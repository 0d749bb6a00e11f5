// The trainer's view of a packed SFT dataset (`megatron preprocess --sft`): one sample per
// pack, packs of the split visited in a seeded shuffle that is redrawn each epoch.
#pragma once

#include <memory>

#include "data/samples.h"

namespace megatron {

// nullptr when the split holds no packs.
std::unique_ptr<SampleSource> make_sft_sample_source(const Config& config, Split split);

}  // namespace megatron
