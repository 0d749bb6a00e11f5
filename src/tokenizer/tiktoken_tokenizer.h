// Megatron's TikTokenizer (--tokenizer-type TikTokenizer): tiktoken's byte-level BPE over a
// vocabulary file in Megatron's JSON form, a list of {"rank", "token_bytes" (base64),
// "token_str"} whose first 256 ranks are the single bytes 0..255. Megatron puts
// --tiktoken-num-special-tokens special tokens first (ids 0..n-1: "<unk>", "<s>", "</s>",
// "<mask>", "<pad>", "<cls>", "<sep>" or --tokenizer-special-tokens, then "<SPECIAL_i>" fillers)
// and shifts every rank up by n; the vocabulary is cut to --vocab-size ids in all (default
// 2^17). Text splits with the v1 or v2 pattern (--tiktoken-pattern), special tokens written in
// the text become their ids (tiktoken's allowed_special="all"), EOD is "</s>" and nothing is
// added around a sequence: ids equal megatron-core's TikTokenTokenizer.text_to_ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace megatron::tok {

struct TikTokenOptions {
  std::string pattern = "v2";                // --tiktoken-pattern: v1 | v2
  int64_t vocab_size = 131072;               // --vocab-size: special tokens + ranks kept
  int64_t num_special_tokens = 1000;         // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens;   // --tokenizer-special-tokens; empty: Megatron's seven
};

// Throws UserError naming the file (and the entry) or the flag, and what to do.
std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path, const TikTokenOptions& options);

}  // namespace megatron::tok
