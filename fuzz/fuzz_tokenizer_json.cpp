// A HF tokenizer.json (normalizers, pre-tokenizers, BPE / WordPiece / Unigram models, added
// tokens, post-processor, decoder) loaded, then used: a few texts encoded and decoded back.
#include <fstream>

#include "core/errors.h"
#include "fuzz_target.h"
#include "tokenizer/hf_tokenizer.h"

MEGATRON_FUZZ_TARGET(tokenizer_json) {
  const std::string path = megatron::fuzz::scratch_file("tokenizer.json");
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  std::unique_ptr<megatron::tok::HfTokenizer> tokenizer;
  try {
    tokenizer = megatron::tok::load_tokenizer_json(path);
  } catch (const megatron::UserError&) {
    return;
  }
  for (const char* text : {"Hello world!", "  two  spaces\n\ttab", "caf\xc3\xa9 \xe6\x95\xb0\xe5\xad\x97 \xf0\x9f\x98\x80", "<|endoftext|>", ""}) {
    const std::vector<int64_t> ids = tokenizer->encode(text);
    (void)tokenizer->decode(ids);
    for (int64_t id : ids) (void)tokenizer->id_to_token(id);
  }
  (void)tokenizer->decode({0, 1, 2, -1, tokenizer->vocab_size(), tokenizer->vocab_size() - 1});
}
