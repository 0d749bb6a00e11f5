// tokenizer.json pre-tokenizers: Split (a regex or string with HF's delimiter behaviours),
// ByteLevel (optional prefix space and GPT-2 regex; its byte->char mapping is left to the
// byte-level BPE model, which works on raw bytes), Digits, and Sequence of them.
// Unsupported types are rejected at load time.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace megatron::tok {

class Regex;

// GPT-2's pre-tokenizer regex, which ByteLevel(use_regex) and GPT2BPETokenizer use.
extern const char* const kGpt2Pattern;

class PreTokenizer {
 public:
  // null JSON -> nullptr. Throws std::invalid_argument for unsupported or malformed entries.
  static std::unique_ptr<PreTokenizer> from_json(const nlohmann::json& j);
  // GPT-2: ByteLevel(add_prefix_space=false, use_regex=true).
  static std::unique_ptr<PreTokenizer> gpt2();
  ~PreTokenizer();

  // Splits text into non-empty pieces (views into text or into *arena).
  void split(std::string_view text, std::vector<std::string_view>* pieces,
             std::deque<std::string>* arena) const;
  // True if the last step is ByteLevel: the model then sees raw bytes.
  bool byte_level() const;

 private:
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  enum class Kind { kSplit, kPrefixSpace, kByteLevel, kDigits };
  struct Step {
    explicit Step(Kind k, std::shared_ptr<Regex> re = nullptr) : kind(k), regex(std::move(re)) {}
    Kind kind;
    std::shared_ptr<Regex> regex;  // Split (string patterns are escaped into a regex)
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool individual_digits = false; // Digits
  };
  static void add_steps(const nlohmann::json& j, std::vector<Step>* steps);
  static void split_piece(const Step& step, std::string_view piece,
                          std::vector<std::string_view>* out);
  std::vector<Step> steps_;
};

}  // namespace megatron::tok
