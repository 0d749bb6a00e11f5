// One line of a pretraining JSONL file as `megatron preprocess` reads it: strict UTF-8, a JSON
// object, the text of its "text" key (a string or a list of strings) tokenized, EOD appended.
#include <nlohmann/json.hpp>

#include "data/preprocess.h"
#include "fuzz_target.h"
#include "tokenizer/tokenizer.h"

namespace {

// One id per byte: enough to exercise everything around the tokenizer.
class ByteTokenizer : public megatron::Tokenizer {
 public:
  std::string decode(const std::vector<int64_t>& ids) const override { return std::string(ids.begin(), ids.end()); }
  int64_t vocab_size() const override { return 257; }
  std::optional<int64_t> bos_id() const override { return std::nullopt; }
  std::optional<int64_t> eos_id() const override { return 256; }
  std::optional<int64_t> token_to_id(std::string_view) const override { return std::nullopt; }
  std::optional<std::string> id_to_token(int64_t id) const override { return std::string(1, char(id)); }

 protected:
  std::vector<int64_t> do_encode(std::string_view text, bool) const override {
    std::vector<int64_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
};

}  // namespace

MEGATRON_FUZZ_TARGET(jsonl) {
  static const ByteTokenizer tokenizer;
  const std::string_view line = megatron::fuzz::as_text(data, size);
  nlohmann::json doc;
  (void)megatron::parse_jsonl_object(line, &doc);
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<int32_t>> sentences;
  const std::string error = megatron::encode_jsonl_line(line, {"text", "code"}, tokenizer, false, true, &tokens, &sentences);
  if (error.empty() && (tokens.size() != 2 || sentences.size() != 2)) __builtin_trap();  // one entry per key
}
