// Added (and special) tokens of a tokenizer.json: found in the text before the model sees it,
// so "<|im_start|>" inside a document becomes its one id. Matching follows HF's
// AddedVocabulary: leftmost-longest over all token contents, with single_word, lstrip and
// rstrip adjusting or discarding matches; tokens with normalized=true are matched in a second
// pass on normalized text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::tok {

struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// A piece of text: either plain text [begin, end) or one added token (id >= 0).
struct Segment {
  size_t begin, end;
  int64_t id;  // -1 for plain text
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);
  bool empty() const { return tokens_.empty(); }

  // Splits text into plain segments and token matches, covering all of it in order. Empty
  // text yields one empty plain segment, as HF (a normalizer may still act on it).
  void split(std::string_view text, std::vector<Segment>* out) const;

 private:
  struct Node {  // trie over bytes, children as a sorted list: tokens are few and short
    std::vector<std::pair<unsigned char, int32_t>> next;
    int32_t token = -1;  // index into tokens_ of the token ending here
  };
  int32_t child(int32_t node, unsigned char c) const;
  // Longest token starting at pos, or -1.
  int32_t longest_at(std::string_view text, size_t pos, size_t* end) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> trie_;
  bool first_byte_[256] = {};
};

}  // namespace megatron::tok
