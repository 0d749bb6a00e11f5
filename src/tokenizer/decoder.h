// tokenizer.json decoders: ByteLevel (GPT-2, Llama 3, Qwen) and the SentencePiece-as-BPE chain
// Replace / ByteFallback / Fuse / Strip (Llama 2), plus Sequence. Each works on the list of
// token strings as HF's decode_chain does; the final text is their concatenation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace megatron::tok {

class Decoder {
 public:
  // null JSON -> nullptr (then tokens are joined with spaces, as HF). Throws
  // std::invalid_argument for unsupported or malformed entries.
  static std::unique_ptr<Decoder> from_json(const nlohmann::json& j);
  static std::unique_ptr<Decoder> byte_level();

  std::string decode(std::vector<std::string> tokens) const;

 private:
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip };
  struct Step {
    explicit Step(Kind k = Kind::kByteLevel) : kind(k) {}
    Kind kind;
    std::string pattern, content;  // Replace (String pattern); Strip content
    size_t start = 0, stop = 0;    // Strip
  };
  static void add_steps(const nlohmann::json& j, std::vector<Step>* steps);
  static void apply(const Step& step, std::vector<std::string>* tokens);
  std::vector<Step> steps_;
};

}  // namespace megatron::tok
