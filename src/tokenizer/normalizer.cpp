// Normalizers; see normalizer.h.
#include "tokenizer/normalizer.h"

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace megatron::tok {
namespace {

// Why a Replace regex's empty match at the start of a text is refused.
constexpr const char* kHfEmptyAtStart =
    "at the start of a text HF's tokenizers inserts the content there twice (a longer content makes it fail): "
    "refused rather than tokenize differently from HF";

}  // namespace

Normalizer::~Normalizer() = default;

std::unique_ptr<Normalizer> Normalizer::from_json(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  auto n = std::unique_ptr<Normalizer>(new Normalizer());
  add_steps(j, &n->steps_);
  return n;
}

void Normalizer::add_steps(const nlohmann::json& j, std::vector<Step>* steps) {
  const std::string type = j.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const auto& sub : j.at("normalizers")) add_steps(sub, steps);
    return;
  }
  Step step{};
  if (type == "NFC") {
    step.kind = Kind::kNFC;
  } else if (type == "NFD") {
    step.kind = Kind::kNFD;
  } else if (type == "NFKC") {
    step.kind = Kind::kNFKC;
  } else if (type == "NFKD") {
    step.kind = Kind::kNFKD;
  } else if (type == "Prepend") {
    step.kind = Kind::kPrepend;
    step.text = j.at("prepend").get<std::string>();
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    step.text = j.at("content").get<std::string>();
    const auto& pattern = j.at("pattern");
    if (pattern.contains("String")) {
      step.pattern = pattern.at("String").get<std::string>();
      if (step.pattern.empty()) throw std::invalid_argument("Replace normalizer with an empty pattern");
    } else if (pattern.contains("Regex")) {
      step.pattern = pattern.at("Regex").get<std::string>();
      step.regex = std::make_shared<Regex>(Regex::translate_oniguruma(step.pattern));
      // HF's tokenizers inserts the content at an empty match, but at the start of a text twice,
      // and a content of two or more characters there makes it panic: nothing to follow. A
      // pattern that matches an empty text would match so at the start of most texts.
      if (step.regex->may_match_empty_text()) {
        throw std::invalid_argument("Replace normalizer pattern '" + step.pattern + "' can match the empty string; " +
                                    kHfEmptyAtStart);
      }
    } else {
      throw std::invalid_argument("Replace normalizer pattern must be String or Regex");
    }
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.left = j.value("strip_left", true);
    step.right = j.value("strip_right", true);
  } else {
    throw std::invalid_argument(
        "normalizer type '" + type +
        "' is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Sequence)");
  }
  steps->push_back(std::move(step));
}

std::string Normalizer::apply(const Step& step, std::string s) {
  switch (step.kind) {
    case Kind::kNFC: return normalize_unicode(s, NormalForm::kNFC);
    case Kind::kNFD: return normalize_unicode(s, NormalForm::kNFD);
    case Kind::kNFKC: return normalize_unicode(s, NormalForm::kNFKC);
    case Kind::kNFKD: return normalize_unicode(s, NormalForm::kNFKD);
    case Kind::kPrepend:
      // HF prepends only to non-empty text.
      return s.empty() ? s : step.text + s;
    case Kind::kReplace: {
      std::string out;
      out.reserve(s.size() + s.size() / 4);
      size_t done = 0;
      if (step.regex) {
        // An empty match inserts the content, as HF's does; at the start of the text HF's own
        // result is not one to follow (above).
        step.regex->for_each_match(s, [&](size_t b, size_t e) {
          if (b == 0 && e == 0) {
            throw UserError("tokenizer.json: the Replace normalizer pattern '" + step.pattern +
                            "' matched the empty string; " + kHfEmptyAtStart);
          }
          out.append(s, done, b - done);
          out += step.text;
          done = e;
        }, /*with_empty=*/true);
      } else {
        for (size_t at = s.find(step.pattern); at != std::string::npos;
             at = s.find(step.pattern, done)) {
          out.append(s, done, at - done);
          out += step.text;
          done = at + step.pattern.size();
        }
      }
      out.append(s, done, std::string::npos);
      return out;
    }
    case Kind::kStrip: {
      size_t begin = 0, end = s.size();
      if (step.left) {
        while (begin < end) {
          size_t i = begin;
          if (!is_white_space(next_code_point(s, &i))) break;
          begin = i;
        }
      }
      if (step.right) {
        while (end > begin) {
          size_t k = end - 1;
          while (k > begin && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
          size_t i = k;
          if (!is_white_space(next_code_point(s, &i))) break;
          end = k;
        }
      }
      return s.substr(begin, end - begin);
    }
  }
  return s;
}

std::string Normalizer::normalize(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) s = apply(step, std::move(s));
  return s;
}

}  // namespace megatron::tok
