// A compiled PCRE2 pattern with Unicode semantics (UTF + UCP), JIT-compiled when the library
// allows, used by the pre-tokenizers to split text the way HF tokenizers' Oniguruma regexes
// do. Matching is thread-safe: match data and JIT stacks are per thread.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace megatron::tok {

class Regex {
 public:
  // Throws std::invalid_argument with PCRE2's message (the caller adds where it came from).
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(begin, end) for every non-overlapping match in text (valid UTF-8), left to
  // right, as Oniguruma's iteration finds them (regex.cpp); empty matches only `with_empty`
  // (a Split pre-tokenizer splits there).
  void for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match,
                      bool with_empty = false) const;

  // Whether the pattern may match an empty text (PCRE2's lower bound on the length of a text it
  // matches is 0). A pattern matching only zero-width inside texts, as (?=b), answers false.
  bool may_match_empty_text() const;

  // PCRE2 syntax differs from Oniguruma's in places; this rewrites HF's patterns so they mean
  // the same (see regex.cpp).
  static std::string translate_oniguruma(const std::string& pattern);
  // A literal string as a pattern.
  static std::string escape(std::string_view literal);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megatron::tok
