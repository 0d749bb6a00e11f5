// The tokenizer interface the rest of megatron.cpp uses (data preprocessing, SFT, inference),
// and the factory behind Megatron's --tokenizer-type / --tokenizer-model / --vocab-file /
// --merge-file / --vocab-size flags. No LibTorch here: ids are plain int64_t.
//
// encode(text) behaves like Megatron's HuggingFaceTokenizer.tokenize (HF's default
// add_special_tokens=True): BOS/EOS appear only where the tokenizer's post-processor or its
// tokenizer_config.json (add_bos_token / add_eos_token) asks for them. encode(text, false)
// never adds them. Special tokens written in the text (e.g. "<|im_start|>") always become
// their ids. decode() keeps special tokens, so decode(encode(text, false)) == text.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megatron {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  std::vector<int64_t> encode(std::string_view text) const { return encode(text, true); }
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const {
    return do_encode(text, add_special_tokens);
  }
  // Unknown ids are skipped, as HF tokenizers does.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;

  // One past the largest id (vocabulary plus added tokens): the embedding size needed.
  virtual int64_t vocab_size() const = 0;
  // The model's own vocabulary, without added tokens (Pai-Megatron-Patch's len(tokenizer.encoder),
  // which --extra-vocab-size counts from).
  virtual int64_t base_vocab_size() const { return vocab_size(); }
  virtual std::optional<int64_t> bos_id() const = 0;
  virtual std::optional<int64_t> eos_id() const = 0;
  // End of document, appended by preprocessing with --append-eod: EOS, as Megatron's
  // HuggingFaceTokenizer (the NullTokenizer overrides it).
  virtual std::optional<int64_t> eod_id() const { return eos_id(); }

  virtual std::optional<int64_t> token_to_id(std::string_view token) const = 0;
  virtual std::optional<std::string> id_to_token(int64_t id) const = 0;

 protected:
  virtual std::vector<int64_t> do_encode(std::string_view text, bool add_special_tokens) const = 0;
};

// What Megatron's tokenizer flags name: --tokenizer-type and the files and sizes it reads.
struct TokenizerSpec {
  std::string type;        // --tokenizer-type
  std::string model;       // --tokenizer-model
  std::string vocab_file;  // --vocab-file (GPT2BPETokenizer)
  std::string merge_file;  // --merge-file (GPT2BPETokenizer)
  // --vocab-size: NullTokenizer's N (ids 0..N-1 plus EOD = N); TikTokenizer's ids in all
  // (0: Megatron's default, 2^17).
  int64_t vocab_size = 0;
  std::string tiktoken_pattern;                  // --tiktoken-pattern v1 | v2 ("": v2)
  int64_t tiktoken_num_special_tokens = 1000;    // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens;       // --tokenizer-special-tokens (TikTokenizer)
};

// type: HuggingFaceTokenizer (model: a directory holding tokenizer.json and optionally
// tokenizer_config.json, or the tokenizer.json file), GPT2BPETokenizer (vocab_file = vocab.json,
// merge_file = merges.txt), SentencePieceTokenizer / GPTSentencePieceTokenizer /
// Llama2Tokenizer (model = a SentencePiece .model), TikTokenizer (model = Megatron's tiktoken
// .json; see tiktoken_tokenizer.h), NullTokenizer (vocab_size = N).
// Throws UserError naming the flag or file and what to do.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerSpec& spec);
// The same without TikTokenizer's options; null_vocab_size is --vocab-size.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& model_path,
                                          const std::string& vocab_file,
                                          const std::string& merge_file, int64_t null_vocab_size);

}  // namespace megatron
