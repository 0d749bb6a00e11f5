// Command-line flags and YAML recipes -> Config. Flag names are Megatron-LM's; a recipe
// (`--config recipe.yaml`) takes the same keys without the leading dashes. Precedence, lowest
// first: Megatron defaults, the model-family preset, the recipe, the command line.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "tokenizer/tokenizer.h"

namespace megatron {

// Parses `megatron train` arguments (argv after the subcommand). Throws UserError naming the
// flag, the recipe key or the file on any unknown flag, bad value or contradiction.
Config parse_train_arguments(const std::vector<std::string>& args);

// Fills derived fields (ffn size, head dim, padded vocab, ...) and rejects contradictory
// settings. `world_size` is the number of ranks taking part (1 for a single process).
void finalize_config(Config& config, int world_size);

// --context-parallel-size and --cp-comm-type against the model and the other flags (finalize_config
// calls it once the layout is known).
void check_context_parallel(const Config& config);

// Vocabulary size (ids the embedding needs) and end-of-document id of the configured tokenizer.
struct TokenizerInfo {
  int64_t vocab_size;
  int64_t eod_id;
  int64_t base_vocab_size;  // without added tokens
};
TokenizerInfo tokenizer_info(const TokenizerSpec& spec);
// The tokenizer the data flags name; vocab_size is --vocab-size (NullTokenizer's N, TikTokenizer's
// ids in all; 0 = the type's default).
TokenizerSpec tokenizer_spec(const DataConfig& data, int64_t vocab_size);

// The `megatron train --help` text: every flag with its default and meaning.
std::string train_help();

}  // namespace megatron
