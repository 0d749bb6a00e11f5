// A SentencePiece .model file (--tokenizer-type GPTSentencePieceTokenizer / Llama2Tokenizer)
// loaded, then texts encoded and decoded back. The protobuf parsing is libsentencepiece's
// (Debian's, uninstrumented); what is fuzzed is that every bad file becomes an error naming it.
#include <fstream>

#include "core/errors.h"
#include "fuzz_target.h"
#include "tokenizer/sentencepiece_tokenizer.h"

MEGATRON_FUZZ_TARGET(sentencepiece) {
  const std::string path = megatron::fuzz::scratch_file("tokenizer.model");
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), std::streamsize(size));
  std::unique_ptr<megatron::Tokenizer> tokenizer;
  try {
    tokenizer = megatron::tok::load_sentencepiece(path, /*add_bos=*/true);
  } catch (const megatron::UserError& e) {
    megatron::fuzz::rejected(e);
    return;
  }
  for (const char* text : {"Hello world!", "  two  spaces\n\ttab 12345", "caf\xc3\xa9 \xe6\x95\xb0 \xf0\x9f\x98\x80", "\xff\xfe", ""}) {
    const std::vector<int64_t> ids = tokenizer->encode(text);
    for (int64_t id : ids) {
      if (id < 0 || id >= tokenizer->vocab_size()) __builtin_trap();
      (void)tokenizer->id_to_token(id);
    }
    (void)tokenizer->decode(ids);
  }
  (void)tokenizer->decode({0, 1, 2, -1, tokenizer->vocab_size(), tokenizer->vocab_size() - 1});
}
