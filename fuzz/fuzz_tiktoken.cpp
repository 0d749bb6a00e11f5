// Megatron's tiktoken vocabulary file (a JSON list of {"rank", "token_bytes" in base64,
// "token_str"}) loaded as --tokenizer-type TikTokenizer loads it (a few special tokens, a small
// --vocab-size cut), then texts encoded and decoded back.
#include <fstream>

#include "core/errors.h"
#include "fuzz_target.h"
#include "tokenizer/tiktoken_tokenizer.h"

MEGATRON_FUZZ_TARGET(tiktoken) {
  const std::string path = megatron::fuzz::scratch_file("tiktoken.json");
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  megatron::tok::TikTokenOptions options;
  options.num_special_tokens = 10;
  options.vocab_size = 270;  // 10 special tokens and the first 260 ranks: the 256 bytes and a few merges
  std::unique_ptr<megatron::Tokenizer> tokenizer;
  try {
    tokenizer = megatron::tok::load_tiktoken(path, options);
  } catch (const megatron::UserError& e) {
    megatron::fuzz::rejected(e);
    return;
  }
  megatron::fuzz::exercise_tokenizer(*tokenizer);
}
