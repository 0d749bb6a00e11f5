// One JSONL line -> token sequences per JSON key, with the reasons a line is rejected (invalid
// UTF-8, invalid JSON, not an object, a missing key, a value of the wrong type, text the
// tokenizer refuses). Mirrors the Encoder of Megatron's preprocess_data.py: a string value is
// one sequence; a list of strings is one sequence per non-empty string; EOD ends a non-empty
// document.
#include <nlohmann/json.hpp>

#include <cstring>

#include "core/errors.h"
#include "core/json_text.h"
#include "data/preprocess.h"

namespace megatron {
namespace {

// Strict UTF-8 as Python decodes it (Megatron opens the input with encoding='utf-8'): no
// overlong forms, no surrogates, nothing above U+10FFFF. Returns "" or why not.
std::string utf8_error(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII dominates JSONL; skip it eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      if ((word & 0x8080808080808080ull) != 0) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    }
    bool ok = len > 0 && i + len <= n && p[i + 1] >= lo && p[i + 1] <= hi;
    for (size_t k = 2; ok && k < len; ++k) ok = p[i + k] >= 0x80 && p[i + k] <= 0xBF;
    if (!ok) return "invalid UTF-8 at byte " + std::to_string(i + 1) + " of the line";
    i += len;
  }
  return "";
}

// nlohmann's message without its "[json.exception.parse_error.101] parse error at line 1, "
// prefix: the line is already named, the column is what helps.
std::string parse_error_text(const char* what) {
  std::string s = what;
  const size_t bracket = s.find("] ");
  if (s.rfind("[json.exception", 0) == 0 && bracket != std::string::npos) s.erase(0, bracket + 2);
  const std::string at_line = "parse error at line 1, ";
  if (s.rfind(at_line, 0) == 0) s.erase(0, at_line.size());
  return s;
}

}  // namespace

const char* json_type_name(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "an object";
}

std::string parse_jsonl_object(std::string_view line, nlohmann::json* doc) {
  if (std::string why = utf8_error(line); !why.empty()) return why;
  try {
    check_json_depth(line, "the line");
    *doc = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number past double's range (1e400)
    return "invalid JSON: " + parse_error_text(e.what());
  } catch (const UserError&) {
    return "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
  }
  if (!doc->is_object()) return std::string("not a JSON object but ") + json_type_name(*doc);
  return "";
}

std::string encode_jsonl_line(std::string_view line, const std::vector<std::string>& json_keys,
                              const Tokenizer& tokenizer, bool include_special_tokens,
                              bool append_eod, std::vector<std::vector<int64_t>>* tokens,
                              std::vector<std::vector<int32_t>>* sentences) {
  tokens->assign(json_keys.size(), {});
  sentences->assign(json_keys.size(), {});
  nlohmann::json doc;
  if (std::string why = parse_jsonl_object(line, &doc); !why.empty()) return why;

  std::optional<int64_t> eod;
  if (append_eod) {
    eod = tokenizer.eod_id();
    if (!eod) throw UserError("--append-eod: the tokenizer has no end-of-document (EOS) token");
  }
  for (size_t k = 0; k < json_keys.size(); ++k) {
    const std::string& key = json_keys[k];
    auto it = doc.find(key);
    if (it == doc.end()) return "missing key \"" + key + "\"";
    std::vector<const std::string*> texts;
    if (it->is_string()) {
      texts.push_back(it->get_ptr<const std::string*>());
    } else if (it->is_array()) {
      for (size_t j = 0; j < it->size(); ++j) {
        const nlohmann::json& element = (*it)[j];
        if (!element.is_string()) {
          return "key \"" + key + "\": list element " + std::to_string(j) + " is " + json_type_name(element) +
                 ", expected a string";
        }
        texts.push_back(element.get_ptr<const std::string*>());
      }
    } else {
      return "key \"" + key + "\" is " + json_type_name(*it) + ", expected a string (or a list of strings)";
    }
    std::vector<int64_t>& out = (*tokens)[k];
    std::vector<int32_t>& lens = (*sentences)[k];
    for (const std::string* text : texts) {
      std::vector<int64_t> ids;
      try {
        ids = tokenizer.encode(*text, include_special_tokens);
      } catch (const UserError& e) {
        return "key \"" + key + "\": the tokenizer rejected the text: " + e.what();
      }
      if (ids.empty()) continue;  // Megatron drops empty sequences
      out.insert(out.end(), ids.begin(), ids.end());
      lens.push_back(static_cast<int32_t>(ids.size()));
    }
    if (eod && !out.empty()) {
      out.push_back(*eod);
      lens.back() += 1;
    }
  }
  return "";
}

}  // namespace megatron
