// SentencePiece .model tokenizers (libsentencepiece).
#pragma once

#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace megatron::tok {

// add_bos: prepend BOS when encode() asks for special tokens (Llama2Tokenizer); Megatron's
// GPT/SentencePiece tokenizers add nothing.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path, bool add_bos);

}  // namespace megatron::tok
