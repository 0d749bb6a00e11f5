// Megatron's TikTokenizer; see tiktoken_tokenizer.h.
#include "tokenizer/tiktoken_tokenizer.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "core/files.h"
#include "core/json_text.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/flat_map.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace megatron::tok {

namespace {

// megatron-core's _PATTERN_TIKTOKEN_V1 / _V2 (tiktoken_tokenizer.py), in fancy-regex syntax,
// which PCRE2 reads alike (possessive quantifiers included); fancy-regex's \s is Unicode
// White_Space, so it takes the same NEL fix as Oniguruma's (Regex::translate_oniguruma).
const char* const kPatternV1 =
    R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
const char* const kPatternV2 =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Megatron's SPECIAL_TOKENS: ids 0..6 unless --tokenizer-special-tokens reorders them.
const std::vector<std::string> kRequiredSpecials = {"<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"};

// Standard base64 with '=' padding; false on any other character or a bad length.
bool base64_decode(const std::string& in, std::string* out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  out->clear();
  if (in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const int pad = last ? (in[i + 3] == '=') + (in[i + 2] == '=') : 0;
    if (pad == 1 && in[i + 2] == '=') return false;  // "x=y=" is not padding
    uint32_t bits = 0;
    for (int k = 0; k < 4 - pad; ++k) {
      const int v = value(in[i + k]);
      if (v < 0) return false;
      bits |= static_cast<uint32_t>(v) << (18 - 6 * k);
    }
    out->push_back(static_cast<char>(bits >> 16));
    if (pad < 2) out->push_back(static_cast<char>((bits >> 8) & 0xFF));
    if (pad < 1) out->push_back(static_cast<char>(bits & 0xFF));
  }
  return true;
}

class TikTokenizer : public Tokenizer {
 public:
  TikTokenizer(std::vector<std::string> specials, std::vector<std::string> token_bytes, const std::string& pattern)
      : specials_(std::move(specials)), token_bytes_(std::move(token_bytes)),
        pattern_(Regex::translate_oniguruma(pattern == "v1" ? kPatternV1 : kPatternV2)) {
    const auto n = static_cast<uint32_t>(specials_.size());
    for (uint32_t r = 0; r < token_bytes_.size(); ++r) ranks_.insert(token_bytes_[r], n + r);
    std::vector<AddedToken> tokens;
    for (uint32_t id = 0; id < n; ++id) {
      AddedToken t;
      t.id = id;
      t.content = specials_[id];
      t.special = true;
      tokens.push_back(std::move(t));
    }
    specials_matcher_ = AddedTokenMatcher(std::move(tokens));
    bos_ = std::find(specials_.begin(), specials_.end(), "<s>") - specials_.begin();
    eos_ = std::find(specials_.begin(), specials_.end(), "</s>") - specials_.begin();
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string bytes;
    for (int64_t id : ids) {
      if (id >= 0 && id < num_special()) {
        bytes += specials_[id];
      } else if (id >= num_special() && id < vocab_size()) {
        bytes += token_bytes_[id - num_special()];
      }
    }
    // tiktoken decodes with errors="replace": a token may end inside a character.
    return is_valid_utf8(bytes) ? bytes : utf8_lossy(bytes);
  }
  int64_t vocab_size() const override { return num_special() + static_cast<int64_t>(token_bytes_.size()); }
  std::optional<int64_t> bos_id() const override { return bos_; }
  std::optional<int64_t> eos_id() const override { return eos_; }
  std::optional<int64_t> token_to_id(std::string_view token) const override {
    for (size_t id = 0; id < specials_.size(); ++id) {
      if (specials_[id] == token) return static_cast<int64_t>(id);
    }
    const uint32_t id = ranks_.find(token);
    if (id == StringMap::kMissing) return std::nullopt;
    return id;
  }
  std::optional<std::string> id_to_token(int64_t id) const override {
    if (id >= 0 && id < num_special()) return specials_[id];
    if (id < num_special() || id >= vocab_size()) return std::nullopt;
    const std::string& bytes = token_bytes_[id - num_special()];
    return is_valid_utf8(bytes) ? bytes : utf8_lossy(bytes);
  }

 protected:
  std::vector<int64_t> do_encode(std::string_view text, bool /*add_special_tokens: Megatron adds none*/) const override {
    std::string repaired;
    if (!is_valid_utf8(text)) {  // Python text is valid Unicode; bad bytes become U+FFFD first
      repaired = utf8_lossy(text);
      text = repaired;
    }
    std::vector<int64_t> ids;
    ids.reserve(text.size() / 3 + 8);
    thread_local std::vector<Segment> segments;
    segments.clear();
    specials_matcher_.split(text, &segments);
    for (const Segment& s : segments) {
      if (s.id >= 0) {
        ids.push_back(s.id);
        continue;
      }
      const std::string_view plain = text.substr(s.begin, s.end - s.begin);
      pattern_.for_each_match(plain, [&](size_t begin, size_t end) { encode_piece(plain.substr(begin, end - begin), &ids); });
    }
    return ids;
  }

 private:
  int64_t num_special() const { return static_cast<int64_t>(specials_.size()); }

  // tiktoken's byte_pair_encode: a piece in the vocabulary is one token; otherwise, from single
  // bytes, the adjacent pair whose concatenation ranks lowest merges (the leftmost on ties)
  // until no pair is in the vocabulary.
  void encode_piece(std::string_view piece, std::vector<int64_t>* ids) const {
    const uint32_t whole = ranks_.find(piece);
    if (whole != StringMap::kMissing) {
      ids->push_back(whole);
      return;
    }
    constexpr uint32_t kNone = StringMap::kMissing;  // above every rank
    struct Part {
      size_t start;
      uint32_t rank;  // of this part merged with the next one
    };
    thread_local std::vector<Part> parts;
    parts.clear();
    for (size_t i = 0; i + 1 < piece.size(); ++i) parts.push_back({i, ranks_.find(piece.substr(i, 2))});
    parts.push_back({piece.size() - 1, kNone});
    parts.push_back({piece.size(), kNone});
    // The rank of parts i and i+1 merged with part i+2 (parts i+1 and i+2 about to become one).
    auto rank_after_merge = [&](size_t i) {
      return i + 3 < parts.size() ? ranks_.find(piece.substr(parts[i].start, parts[i + 3].start - parts[i].start)) : kNone;
    };
    for (;;) {
      size_t best = 0;
      uint32_t best_rank = kNone;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        if (parts[i].rank < best_rank) best_rank = parts[i].rank, best = i;
      }
      if (best_rank == kNone) break;
      if (best > 0) parts[best - 1].rank = rank_after_merge(best - 1);
      parts[best].rank = rank_after_merge(best);
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      ids->push_back(ranks_.find(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start)));
    }
  }

  std::vector<std::string> specials_;     // id -> text, ids [0, n)
  std::vector<std::string> token_bytes_;  // rank -> bytes; id = n + rank
  StringMap ranks_;                       // bytes -> id
  AddedTokenMatcher specials_matcher_;
  Regex pattern_;
  int64_t bos_ = 0, eos_ = 0;
};

// The special tokens in id order: the named ones, then "<SPECIAL_i>" up to num_special_tokens.
std::vector<std::string> special_tokens(const TikTokenOptions& o) {
  std::vector<std::string> specials = o.special_tokens.empty() ? kRequiredSpecials : o.special_tokens;
  std::set<std::string> seen(specials.begin(), specials.end());
  if (seen.size() != specials.size()) throw UserError("--tokenizer-special-tokens: each special token may appear once");
  for (const std::string& required : kRequiredSpecials) {
    if (seen.count(required) == 0) {
      throw UserError("--tokenizer-special-tokens must include " + required +
                      " (TikTokenizer needs <unk> <s> </s> <mask> <pad> <cls> <sep>, as Megatron)");
    }
  }
  if (o.num_special_tokens < static_cast<int64_t>(specials.size())) {
    throw UserError("--tiktoken-num-special-tokens " + std::to_string(o.num_special_tokens) + " is fewer than the " +
                    std::to_string(specials.size()) + " special tokens named");
  }
  for (int64_t i = static_cast<int64_t>(specials.size()); i < o.num_special_tokens; ++i) {
    std::string filler = "<SPECIAL_" + std::to_string(i) + ">";
    if (!seen.insert(filler).second) throw UserError("--tokenizer-special-tokens: " + filler + " is also a generated filler name");
    specials.push_back(std::move(filler));
  }
  return specials;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path, const TikTokenOptions& o) {
  if (o.pattern != "v1" && o.pattern != "v2") throw UserError("--tiktoken-pattern must be v1 or v2 (got '" + o.pattern + "')");
  if (o.num_special_tokens < 0 || o.num_special_tokens > (int64_t{1} << 24)) {
    throw UserError("--tiktoken-num-special-tokens must be between 0 and 2^24 (got " + std::to_string(o.num_special_tokens) + ")");
  }
  const int64_t keep = o.vocab_size - o.num_special_tokens;
  if (o.vocab_size > (int64_t{1} << 31) || keep < 256) {
    throw UserError("--vocab-size " + std::to_string(o.vocab_size) + " must hold the " + std::to_string(o.num_special_tokens) +
                    " special tokens and at least the 256 byte tokens (and stay below 2^31)");
  }
  std::vector<std::string> specials = special_tokens(o);
  if (path.empty()) {
    throw UserError("--tokenizer-type TikTokenizer needs --tokenizer-model: Megatron's tiktoken vocabulary, "
                    "a .json list of {\"rank\", \"token_bytes\", \"token_str\"}");
  }
  nlohmann::json vocab;
  try {
    const std::string text = read_file(path);
    check_json_depth(text, "--tokenizer-model " + path);
    vocab = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError("--tokenizer-model " + path + ": not valid JSON (" + e.what() + "); TikTokenizer reads Megatron's tiktoken "
                    "vocabulary, a .json list of {\"rank\", \"token_bytes\", \"token_str\"}");
  }
  if (!vocab.is_array()) {
    throw UserError("--tokenizer-model " + path + ": expected a JSON list of {\"rank\", \"token_bytes\", \"token_str\"} "
                    "(Megatron's tiktoken vocabulary), got a " + std::string(vocab.type_name()));
  }
  if (static_cast<int64_t>(vocab.size()) < keep) {
    throw UserError("--tokenizer-model " + path + " holds " + std::to_string(vocab.size()) + " ranks, but --vocab-size " +
                    std::to_string(o.vocab_size) + " with " + std::to_string(o.num_special_tokens) + " special tokens needs " +
                    std::to_string(keep) + ": pass --vocab-size " + std::to_string(vocab.size() + o.num_special_tokens));
  }
  std::vector<std::string> token_bytes(static_cast<size_t>(keep));
  StringMap seen;
  for (int64_t i = 0; i < keep; ++i) {
    const nlohmann::json& entry = vocab[static_cast<size_t>(i)];
    auto bad = [&](const std::string& why) {
      return UserError("--tokenizer-model " + path + ": entry " + std::to_string(i) + " " + why +
                       " (each entry i is {\"rank\": i, \"token_bytes\": base64, \"token_str\": text}, ranks 0-255 the single bytes)");
    };
    if (!entry.is_object() || !entry.contains("rank") || !entry.contains("token_bytes")) throw bad("lacks \"rank\" or \"token_bytes\"");
    const nlohmann::json& rank = entry.at("rank");
    const nlohmann::json& b64 = entry.at("token_bytes");
    if (!rank.is_number_integer() || rank.get<int64_t>() != i) throw bad("has rank " + rank.dump() + ", not " + std::to_string(i));
    if (!b64.is_string() || !base64_decode(b64.get<std::string>(), &token_bytes[i]) || token_bytes[i].empty()) {
      throw bad("has token_bytes that are not non-empty base64");
    }
    if (i < 256 && token_bytes[i] != std::string(1, static_cast<char>(i))) throw bad("is not the single byte " + std::to_string(i));
    if (!seen.insert(token_bytes[i], 0)) throw bad("repeats the bytes of an earlier entry");
  }
  return std::make_unique<TikTokenizer>(std::move(specials), std::move(token_bytes), o.pattern);
}

}  // namespace megatron::tok
