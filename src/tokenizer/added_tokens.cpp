// Added-token matching; see added_tokens.h.
#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace megatron::tok {

namespace {

// Approximates Rust regex's \w (alphanumeric, marks, connector punctuation) for the
// single_word check: ASCII exactly, and any non-ASCII, non-space code point counts as a word
// character except general punctuation and symbols blocks.
bool is_word_char(int32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  if (is_white_space(cp)) return false;
  if ((cp >= 0x2000 && cp <= 0x2BFF) || (cp >= 0x3000 && cp <= 0x303F) ||
      (cp >= 0xFE30 && cp <= 0xFE4F) || (cp >= 0xFF00 && cp <= 0xFF0F) || cp >= 0x1F000) {
    return false;
  }
  return true;
}

int32_t last_code_point(std::string_view s) {
  if (s.empty()) return -1;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return next_code_point(s, &i);
}

int32_t first_code_point(std::string_view s) {
  if (s.empty()) return -1;
  size_t i = 0;
  return next_code_point(s, &i);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  trie_.emplace_back();
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& content = tokens_[t].content;
    if (content.empty()) continue;
    first_byte_[static_cast<unsigned char>(content[0])] = true;
    int32_t node = 0;
    for (unsigned char c : content) {
      int32_t next = child(node, c);
      if (next < 0) {
        next = static_cast<int32_t>(trie_.size());
        trie_.emplace_back();
        auto& list = trie_[node].next;
        list.insert(std::lower_bound(list.begin(), list.end(), std::make_pair(c, int32_t{0})),
                    {c, next});
      }
      node = next;
    }
    if (trie_[node].token < 0) trie_[node].token = static_cast<int32_t>(t);
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char c) const {
  const auto& list = trie_[node].next;
  auto it = std::lower_bound(list.begin(), list.end(), std::make_pair(c, int32_t{0}));
  return it != list.end() && it->first == c ? it->second : -1;
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t* end) const {
  int32_t node = 0, found = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    node = child(node, static_cast<unsigned char>(text[i]));
    if (node < 0) break;
    if (trie_[node].token >= 0) found = trie_[node].token, *end = i + 1;
  }
  return found;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>* out) const {
  if (text.empty()) {
    out->push_back({0, 0, -1});
    return;
  }
  size_t emitted = 0;  // text before this is already in out
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t stop = 0;
    int32_t t = longest_at(text, pos, &stop);
    if (t < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[static_cast<size_t>(t)];
    size_t start = pos;
    // A match is consumed (the scan resumes after it) even when single_word discards it,
    // as the leftmost-longest iterator HF uses.
    pos = stop;
    if (tok.single_word) {
      bool left_ok = start == 0 || !is_word_char(last_code_point(text.substr(0, start)));
      bool right_ok = stop == text.size() || !is_word_char(first_code_point(text.substr(stop)));
      if (!left_ok || !right_ok) continue;
    }
    if (tok.lstrip) {
      size_t s = start;
      while (s > emitted) {
        size_t k = s - 1;
        while (k > emitted && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80) --k;
        size_t j = k;
        if (!is_white_space(next_code_point(text, &j))) break;
        s = k;
      }
      start = s;
    }
    if (tok.rstrip) {
      size_t j = stop;
      while (j < text.size()) {
        size_t k = j;
        if (!is_white_space(next_code_point(text, &k))) break;
        j = k;
      }
      stop = j;
      pos = stop;
    }
    if (emitted < start) out->push_back({emitted, start, -1});
    out->push_back({start, stop, tok.id});
    emitted = stop;
  }
  if (emitted < text.size()) out->push_back({emitted, text.size(), -1});
}

}  // namespace megatron::tok
