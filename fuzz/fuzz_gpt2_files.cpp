// GPT-2 style vocab.json and merges.txt (Megatron's GPT2BPETokenizer): the input is the two files
// joined by a line "#### merges ####"; loaded, then a text encoded and decoded back.
#include <fstream>

#include "core/errors.h"
#include "fuzz_target.h"
#include "tokenizer/hf_tokenizer.h"

MEGATRON_FUZZ_TARGET(gpt2_files) {
  const auto [vocab, merges] = megatron::fuzz::split(megatron::fuzz::as_text(data, size), "\n#### merges ####\n");
  const std::string vocab_path = megatron::fuzz::scratch_file("vocab.json"), merges_path = megatron::fuzz::scratch_file("merges.txt");
  std::ofstream(vocab_path, std::ios::binary | std::ios::trunc) << vocab;
  std::ofstream(merges_path, std::ios::binary | std::ios::trunc) << merges;
  try {
    const auto tokenizer = megatron::tok::load_gpt2_files(vocab_path, merges_path);
    (void)tokenizer->decode(tokenizer->encode("Hello world! caf\xc3\xa9 <|endoftext|>"));
  } catch (const megatron::UserError&) {
  }
}
