// make_tokenizer (Megatron's --tokenizer-type dispatch) and the NullTokenizer.
#include <cerrno>
#include <cstdlib>

#include "core/errors.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/sentencepiece_tokenizer.h"
#include "tokenizer/tiktoken_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace megatron {

namespace {

// Megatron's _NullTokenizer: the text is already ids (whitespace-separated integers); the
// vocabulary is N ids plus EOD = N. Used with --mock-data and pre-tokenized inputs.
class NullTokenizer : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t n) : n_(n) {}

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += ' ';
      out += std::to_string(ids[i]);
    }
    return out;
  }
  int64_t vocab_size() const override { return n_ + 1; }
  std::optional<int64_t> bos_id() const override { return std::nullopt; }
  std::optional<int64_t> eos_id() const override { return std::nullopt; }
  std::optional<int64_t> eod_id() const override { return n_; }
  std::optional<int64_t> token_to_id(std::string_view token) const override {
    int64_t id = 0;
    if (!parse(std::string(token), &id) || id < 0 || id > n_) return std::nullopt;
    return id;
  }
  std::optional<std::string> id_to_token(int64_t id) const override {
    if (id < 0 || id > n_) return std::nullopt;
    return std::to_string(id);
  }

 protected:
  std::vector<int64_t> do_encode(std::string_view text, bool) const override {
    std::vector<int64_t> ids;
    size_t i = 0;
    while (i < text.size()) {
      while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
      size_t start = i;
      while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i]))) ++i;
      if (start == i) break;
      std::string word(text.substr(start, i - start));
      int64_t id = 0;
      if (!parse(word, &id)) {
        throw UserError("NullTokenizer: '" + word +
                        "' is not an integer; its input must be whitespace-separated token ids");
      }
      if (id < 0 || id > n_) {
        throw UserError("NullTokenizer: token id " + word + " is outside [0, " + std::to_string(n_) +
                        "] (--vocab-size " + std::to_string(n_) + " plus EOD)");
      }
      ids.push_back(id);
    }
    return ids;
  }

 private:
  static bool parse(const std::string& s, int64_t* out) {
    if (s.empty()) return false;
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno != 0 || end != s.c_str() + s.size()) return false;
    *out = v;
    return true;
  }
  int64_t n_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerSpec& spec) {
  const std::string& type = spec.type;
  if (type == "HuggingFaceTokenizer") {
    if (spec.model.empty()) {
      throw UserError("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model (a directory "
                      "holding tokenizer.json, or the file)");
    }
    return tok::load_tokenizer_json(spec.model);
  }
  if (type == "GPT2BPETokenizer") return tok::load_gpt2_files(spec.vocab_file, spec.merge_file);
  if (type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer") {
    return tok::load_sentencepiece(spec.model, /*add_bos=*/false);
  }
  if (type == "Llama2Tokenizer") return tok::load_sentencepiece(spec.model, /*add_bos=*/true);
  if (type == "TikTokenizer") {
    tok::TikTokenOptions options;
    if (!spec.tiktoken_pattern.empty()) options.pattern = spec.tiktoken_pattern;
    if (spec.vocab_size > 0) options.vocab_size = spec.vocab_size;
    options.num_special_tokens = spec.tiktoken_num_special_tokens;
    options.special_tokens = spec.special_tokens;
    return tok::load_tiktoken(spec.model, options);
  }
  if (type == "NullTokenizer") {
    if (spec.vocab_size <= 0) {
      throw UserError("--tokenizer-type NullTokenizer needs --vocab-size N (N > 0)");
    }
    return std::make_unique<NullTokenizer>(spec.vocab_size);
  }
  throw UserError("--tokenizer-type " + type +
                  " is not supported; use HuggingFaceTokenizer, GPT2BPETokenizer, "
                  "SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, TikTokenizer "
                  "or NullTokenizer");
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& model_path,
                                          const std::string& vocab_file,
                                          const std::string& merge_file, int64_t null_vocab_size) {
  TokenizerSpec spec;
  spec.type = type;
  spec.model = model_path;
  spec.vocab_file = vocab_file;
  spec.merge_file = merge_file;
  spec.vocab_size = null_vocab_size;
  return make_tokenizer(spec);
}

}  // namespace megatron
