// The model a plan is made for, from `megatron train`'s flags (or a recipe, or --load-hf's
// config.json): the architecture adopted, the vocabulary resolved once into --vocab-size (the
// search finalizes hundreds of layouts and should not read a tokenizer each time), no data,
// checkpoint or learning rate needed. UserError naming the flag when the vocabulary's size or
// --global-batch-size is missing.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"

namespace megatron::plan {

Config model_for_plan(const std::vector<std::string>& train_flags);

}  // namespace megatron::plan
