// tokenizer.json normalizers: Unicode normal forms (NFC for Qwen), Prepend and Replace (Llama 2
// style SentencePiece-as-BPE), Strip, and Sequence of them. Other types are rejected at load
// time with a clear message rather than silently producing different ids.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace megatron::tok {

class Regex;

class Normalizer {
 public:
  // null JSON -> nullptr. Throws std::invalid_argument for unsupported or malformed entries.
  static std::unique_ptr<Normalizer> from_json(const nlohmann::json& j);
  ~Normalizer();

  std::string normalize(std::string_view text) const;

 private:
  enum class Kind { kNFC, kNFD, kNFKC, kNFKD, kPrepend, kReplace, kStrip };
  struct Step {
    Kind kind;
    std::string text;                 // Prepend content / Replace content
    std::string pattern;              // Replace: the String pattern, or the Regex as written
    std::shared_ptr<Regex> regex;     // Replace with a Regex pattern
    bool left = false, right = false; // Strip
  };
  static void add_steps(const nlohmann::json& j, std::vector<Step>* steps);
  static std::string apply(const Step& step, std::string s);
  std::vector<Step> steps_;
};

}  // namespace megatron::tok
