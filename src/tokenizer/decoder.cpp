// Decoders; see decoder.h.
#include "tokenizer/decoder.h"

#include <cctype>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tokenizer/unicode.h"

namespace megatron::tok {

std::unique_ptr<Decoder> Decoder::from_json(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  auto d = std::unique_ptr<Decoder>(new Decoder());
  add_steps(j, &d->steps_);
  return d;
}

std::unique_ptr<Decoder> Decoder::byte_level() {
  auto d = std::unique_ptr<Decoder>(new Decoder());
  d->steps_.push_back(Step(Kind::kByteLevel));
  return d;
}

void Decoder::add_steps(const nlohmann::json& j, std::vector<Step>* steps) {
  const std::string type = j.at("type").get<std::string>();
  Step step;
  if (type == "Sequence") {
    for (const auto& sub : j.at("decoders")) add_steps(sub, steps);
    return;
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    const auto& pattern = j.at("pattern");
    if (!pattern.contains("String")) {
      throw std::invalid_argument("Replace decoder: only String patterns are supported");
    }
    step.pattern = pattern.at("String").get<std::string>();
    step.content = j.at("content").get<std::string>();
    if (step.pattern.empty()) throw std::invalid_argument("Replace decoder with an empty pattern");
  } else if (type == "ByteFallback") {
    step.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.content = j.at("content").get<std::string>();
    step.start = j.value("start", size_t{0});
    step.stop = j.value("stop", size_t{0});
  } else {
    throw std::invalid_argument(
        "decoder type '" + type +
        "' is not supported (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, Sequence)");
  }
  steps->push_back(std::move(step));
}

void Decoder::apply(const Step& step, std::vector<std::string>* tokens) {
  switch (step.kind) {
    case Kind::kByteLevel: {
      // Tokens made of byte-alphabet characters become their bytes; any other token (an
      // added token with, say, a space) is kept as is. The joined bytes are made valid UTF-8.
      const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
      std::string bytes, piece;
      for (const std::string& t : *tokens) {
        if (alphabet.decode(t, &piece)) {
          bytes += piece;
        } else {
          bytes += t;
        }
      }
      tokens->assign(1, utf8_lossy(bytes));
      return;
    }
    case Kind::kReplace:
      for (std::string& t : *tokens) {
        std::string out;
        size_t done = 0;
        for (size_t at = t.find(step.pattern); at != std::string::npos;
             at = t.find(step.pattern, done)) {
          out.append(t, done, at - done);
          out += step.content;
          done = at + step.pattern.size();
        }
        out.append(t, done, std::string::npos);
        t = std::move(out);
      }
      return;
    case Kind::kByteFallback: {
      // Runs of <0xHH> tokens become the text they spell, or one U+FFFD per byte if that
      // text is not valid UTF-8.
      std::vector<std::string> out;
      std::string run;
      size_t run_len = 0;
      auto flush = [&]() {
        if (run_len == 0) return;
        if (is_valid_utf8(run)) {
          out.push_back(run);
        } else {
          for (size_t i = 0; i < run_len; ++i) out.push_back("\xEF\xBF\xBD");
        }
        run.clear();
        run_len = 0;
      };
      for (std::string& t : *tokens) {
        if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
            std::isxdigit(static_cast<unsigned char>(t[3])) &&
            std::isxdigit(static_cast<unsigned char>(t[4]))) {
          run.push_back(static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
          ++run_len;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      *tokens = std::move(out);
      return;
    }
    case Kind::kFuse: {
      std::string all;
      for (const std::string& t : *tokens) all += t;
      tokens->assign(1, std::move(all));
      return;
    }
    case Kind::kStrip:
      // Strips up to `start` leading and `stop` trailing copies of the content character from
      // every token.
      for (std::string& t : *tokens) {
        const std::string& c = step.content;
        size_t begin = 0, end = t.size();
        for (size_t i = 0; i < step.start && t.compare(begin, c.size(), c) == 0 && !c.empty(); ++i) {
          begin += c.size();
        }
        for (size_t i = 0; i < step.stop && end >= begin + c.size() && !c.empty() &&
                           t.compare(end - c.size(), c.size(), c) == 0;
             ++i) {
          end -= c.size();
        }
        t = t.substr(begin, end - begin);
      }
      return;
  }
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  for (const Step& step : steps_) apply(step, &tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace megatron::tok
