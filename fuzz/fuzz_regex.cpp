// tokenizer.json's regexes: an Oniguruma pattern (the input's first line) translated for PCRE2,
// compiled, and matched over the rest of the input as the pre-tokenizers do.
#include <stdexcept>

#include "fuzz_target.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

MEGATRON_FUZZ_TARGET(regex) {
  const auto [pattern, text] = megatron::fuzz::split(megatron::fuzz::as_text(data, size), "\n");
  std::unique_ptr<megatron::tok::Regex> regex;
  try {
    regex = std::make_unique<megatron::tok::Regex>(megatron::tok::Regex::translate_oniguruma(std::string(pattern)));
  } catch (const std::invalid_argument&) {  // PCRE2 refused the pattern: its documented answer
    return;
  }
  // Matching takes valid UTF-8 (the tokenizers check the text first).
  if (!megatron::tok::is_valid_utf8(text)) return;
  size_t last = 0;
  regex->for_each_match(text, [&](size_t begin, size_t end) {
    if (begin < last || end < begin || end > text.size()) __builtin_trap();  // matches in order, inside the text
    last = end;
  });
}
