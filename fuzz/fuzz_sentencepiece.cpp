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
  megatron::fuzz::exercise_tokenizer(*tokenizer);
}
