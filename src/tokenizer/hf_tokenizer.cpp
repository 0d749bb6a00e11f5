// Encoding and decoding through the HF pipeline; see hf_tokenizer.h.
#include "tokenizer/hf_tokenizer.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace megatron::tok {

HfTokenizer::HfTokenizer(HfParts parts) : parts_(std::move(parts)) {
  std::vector<AddedToken> raw, normalized;
  vocab_size_ = parts_.model->max_id() + 1;
  for (const AddedToken& t : parts_.added_tokens) {
    (t.normalized && parts_.normalizer ? normalized : raw).push_back(t);
    added_by_content_.emplace(t.content, t.id);
    added_by_id_.emplace(t.id, t.content);
    vocab_size_ = std::max(vocab_size_, t.id + 1);
  }
  raw_added_ = AddedTokenMatcher(std::move(raw));
  normalized_added_ = AddedTokenMatcher(std::move(normalized));
}

void HfTokenizer::encode_plain(std::string_view text, std::vector<int64_t>* ids) const {
  if (!parts_.pre_tokenizer) {
    parts_.model->encode_word(text, ids);
    return;
  }
  thread_local std::vector<std::string_view> pieces;
  thread_local std::deque<std::string> arena;
  arena.clear();
  parts_.pre_tokenizer->split(text, &pieces, &arena);
  for (std::string_view p : pieces) parts_.model->encode_word(p, ids);
}

void HfTokenizer::encode_normalized(std::string_view text, std::vector<int64_t>* ids) const {
  std::string normalized;
  if (parts_.normalizer) {
    normalized = parts_.normalizer->normalize(text);
    text = normalized;
  }
  if (normalized_added_.empty()) {
    encode_plain(text, ids);
    return;
  }
  std::vector<Segment> segments;
  normalized_added_.split(text, &segments);
  for (const Segment& s : segments) {
    if (s.id >= 0) {
      ids->push_back(s.id);
    } else {
      encode_plain(text.substr(s.begin, s.end - s.begin), ids);
    }
  }
}

std::vector<int64_t> HfTokenizer::do_encode(std::string_view text, bool add_special_tokens) const {
  // The regex engine needs valid UTF-8; HF only ever sees valid text (a Rust &str), so bad
  // bytes become U+FFFD first.
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = utf8_lossy(text);
    text = repaired;
  }
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids = parts_.prefix_ids;
  if (raw_added_.empty()) {
    encode_normalized(text, &ids);
  } else {
    thread_local std::vector<Segment> segments;
    segments.clear();
    raw_added_.split(text, &segments);
    for (const Segment& s : segments) {
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else {
        encode_normalized(text.substr(s.begin, s.end - s.begin), &ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), parts_.suffix_ids.begin(), parts_.suffix_ids.end());
  return ids;
}

std::string HfTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    if (auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      tokens.push_back(it->second);
    } else if (const std::string* t = parts_.model->id_to_token(id)) {
      tokens.push_back(*t);
    }
  }
  if (parts_.decoder) return parts_.decoder->decode(std::move(tokens));
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out += ' ';
    out += tokens[i];
  }
  return out;
}

std::optional<int64_t> HfTokenizer::token_to_id(std::string_view token) const {
  if (auto it = added_by_content_.find(std::string(token)); it != added_by_content_.end()) {
    return it->second;
  }
  int64_t id = parts_.model->token_to_id(token);
  if (id < 0) return std::nullopt;
  return id;
}

std::optional<std::string> HfTokenizer::id_to_token(int64_t id) const {
  if (auto it = added_by_id_.find(id); it != added_by_id_.end()) return it->second;
  if (const std::string* t = parts_.model->id_to_token(id)) return *t;
  return std::nullopt;
}

}  // namespace megatron::tok
