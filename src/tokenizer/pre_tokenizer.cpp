// Pre-tokenizers; see pre_tokenizer.h.
#include "tokenizer/pre_tokenizer.h"

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tokenizer/regex.h"

namespace megatron::tok {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

std::shared_ptr<Regex> gpt2_regex() {
  static const std::shared_ptr<Regex> re =
      std::make_shared<Regex>(Regex::translate_oniguruma(kGpt2Pattern));
  return re;
}

}  // namespace

PreTokenizer::~PreTokenizer() = default;

std::unique_ptr<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  auto p = std::unique_ptr<PreTokenizer>(new PreTokenizer());
  add_steps(j, &p->steps_);
  for (size_t i = 0; i + 1 < p->steps_.size(); ++i) {
    if (p->steps_[i].kind == Kind::kByteLevel) {
      // Steps after ByteLevel would see byte-level characters, which this implementation
      // never materializes.
      throw std::invalid_argument("pre-tokenizer steps after ByteLevel are not supported");
    }
  }
  return p;
}

std::unique_ptr<PreTokenizer> PreTokenizer::gpt2() {
  auto p = std::unique_ptr<PreTokenizer>(new PreTokenizer());
  p->steps_.push_back(Step(Kind::kSplit, gpt2_regex()));
  p->steps_.push_back(Step(Kind::kByteLevel));
  return p;
}

void PreTokenizer::add_steps(const nlohmann::json& j, std::vector<Step>* steps) {
  const std::string type = j.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const auto& sub : j.at("pretokenizers")) add_steps(sub, steps);
    return;
  }
  if (type == "Split") {
    Step step(Kind::kSplit);
    const auto& pattern = j.at("pattern");
    if (pattern.contains("Regex")) {
      step.regex = std::make_shared<Regex>(
          Regex::translate_oniguruma(pattern.at("Regex").get<std::string>()));
    } else if (pattern.contains("String")) {
      step.regex = std::make_shared<Regex>(Regex::escape(pattern.at("String").get<std::string>()));
    } else {
      throw std::invalid_argument("Split pre-tokenizer pattern must be String or Regex");
    }
    const std::string behavior = j.at("behavior").get<std::string>();
    if (behavior == "Removed") {
      step.behavior = Behavior::kRemoved;
    } else if (behavior == "Isolated") {
      step.behavior = Behavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = Behavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = Behavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = Behavior::kContiguous;
    } else {
      throw std::invalid_argument("unknown Split behavior '" + behavior + "'");
    }
    step.invert = j.value("invert", false);
    steps->push_back(std::move(step));
  } else if (type == "ByteLevel") {
    // HF order: prefix space, then GPT-2's regex split, then the byte mapping (implicit).
    if (j.value("add_prefix_space", true)) steps->push_back(Step(Kind::kPrefixSpace));
    if (j.value("use_regex", true)) steps->push_back(Step(Kind::kSplit, gpt2_regex()));
    steps->push_back(Step(Kind::kByteLevel));
  } else if (type == "Digits") {
    Step step(Kind::kDigits);
    step.individual_digits = j.value("individual_digits", false);
    step.regex = std::make_shared<Regex>(step.individual_digits ? "\\p{N}" : "\\p{N}+");
    step.behavior = Behavior::kIsolated;
    steps->push_back(std::move(step));
  } else {
    throw std::invalid_argument("pre-tokenizer type '" + type +
                                "' is not supported (supported: Split, ByteLevel, Digits, Sequence)");
  }
}

bool PreTokenizer::byte_level() const {
  return !steps_.empty() && steps_.back().kind == Kind::kByteLevel;
}

void PreTokenizer::split_piece(const Step& step, std::string_view piece,
                               std::vector<std::string_view>* out) {
  // Pieces covering the text: (begin, end, is_delimiter); then HF's behaviour decides which
  // are kept and what they are merged with.
  struct Part {
    size_t begin, end;
    bool match;
  };
  thread_local std::vector<Part> parts;
  parts.clear();
  size_t last = 0;
  // Empty matches split too (HF keeps them as matches and drops the empty pieces).
  step.regex->for_each_match(piece, [&](size_t b, size_t e) {
    if (b > last) parts.push_back({last, b, false});
    parts.push_back({b, e, true});
    last = e;
  }, /*with_empty=*/true);
  if (last < piece.size()) parts.push_back({last, piece.size(), false});
  if (step.invert) {
    for (Part& p : parts) p.match = !p.match;
  }
  auto emit = [&](size_t b, size_t e) {
    if (e > b) out->push_back(piece.substr(b, e - b));
  };
  switch (step.behavior) {
    case Behavior::kIsolated:
      for (const Part& p : parts) emit(p.begin, p.end);
      break;
    case Behavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.match) emit(p.begin, p.end);
      }
      break;
    case Behavior::kContiguous:
    case Behavior::kMergedWithPrevious: {
      const bool contiguous = step.behavior == Behavior::kContiguous;
      std::vector<std::pair<size_t, size_t>> merged;
      bool previous_match = false;
      for (const Part& p : parts) {
        bool join = contiguous ? p.match == previous_match : (p.match && !previous_match);
        if (join && !merged.empty()) {
          merged.back().second = p.end;
        } else {
          merged.push_back({p.begin, p.end});
        }
        previous_match = p.match;
      }
      for (const auto& [b, e] : merged) emit(b, e);
      break;
    }
    case Behavior::kMergedWithNext: {
      std::vector<std::pair<size_t, size_t>> merged;  // built right to left
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !previous_match && !merged.empty()) {
          merged.back().first = it->begin;
        } else {
          merged.push_back({it->begin, it->end});
        }
        previous_match = it->match;
      }
      for (auto it = merged.rbegin(); it != merged.rend(); ++it) emit(it->first, it->second);
      break;
    }
  }
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>* pieces,
                         std::deque<std::string>* arena) const {
  pieces->clear();
  if (!text.empty()) pieces->push_back(text);
  thread_local std::vector<std::string_view> next;
  for (const Step& step : steps_) {
    if (step.kind == Kind::kByteLevel) continue;
    if (step.kind == Kind::kPrefixSpace) {
      for (std::string_view& p : *pieces) {
        if (p.front() != ' ') {
          arena->push_back(" ");
          arena->back().append(p);
          p = arena->back();
        }
      }
      continue;
    }
    next.clear();
    for (std::string_view p : *pieces) split_piece(step, p, &next);
    pieces->swap(next);
  }
}

}  // namespace megatron::tok
