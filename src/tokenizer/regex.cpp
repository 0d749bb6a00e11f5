// PCRE2 wrapper; see regex.h.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <atomic>
#include <cctype>
#include <stdexcept>
#include <unordered_map>

namespace megatron::tok {

namespace {

// Per-thread match data and JIT stack, shared by all patterns on that thread (sized for the
// largest pattern seen). A 1 MiB JIT stack lets lookaheads over long whitespace runs succeed.
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  pcre2_match_context* context = nullptr;
  uint32_t pairs = 0;
  ~ThreadMatchState() {
    if (data) pcre2_match_data_free(data);
    if (context) pcre2_match_context_free(context);
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
  }
  void ensure(uint32_t capture_pairs) {
    if (!context) {
      context = pcre2_match_context_create(nullptr);
      jit_stack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
      if (jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
    if (capture_pairs > pairs) {
      if (data) pcre2_match_data_free(data);
      data = pcre2_match_data_create(capture_pairs, nullptr);
      pairs = capture_pairs;
    }
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
  uint32_t capture_pairs = 1;
  bool jit = false;
};

Regex::Regex(const std::string& pattern) : impl_(std::make_unique<Impl>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // The pattern's UTF-8 is checked (a --tiktoken-pattern is raw bytes; invalid UTF-8 under
  // PCRE2_NO_UTF_CHECK crashed the compiler); texts are checked by the callers.
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &error,
                              &offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw std::invalid_argument("invalid regex at offset " + std::to_string(offset) + ": " +
                                reinterpret_cast<const char*>(message));
  }
  uint32_t captures = 0;
  pcre2_pattern_info(impl_->code, PCRE2_INFO_CAPTURECOUNT, &captures);
  impl_->capture_pairs = captures + 1;
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

bool Regex::may_match_empty_text() const {
  uint32_t shortest = 0;
  pcre2_pattern_info(impl_->code, PCRE2_INFO_MINLENGTH, &shortest);
  return shortest == 0;
}

Regex::~Regex() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

void Regex::for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match,
                           bool with_empty) const {
  ThreadMatchState& st = thread_state();
  st.ensure(impl_->capture_pairs);
  // An empty view may hold a null pointer, which PCRE2 10.42 refuses (and its JIT reads as a
  // match): give it a real empty string.
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() != nullptr ? text.data() : "");
  // Oniguruma's iteration (HF's find_iter): each search starts where the last match ended; an
  // empty match found by a search that starts at the end of the previous match is skipped and
  // the search moves one code point on (so no position matches twice, and an empty match never
  // directly follows a match).
  size_t pos = 0;
  size_t last_match_end = std::string_view::npos;
  while (pos <= text.size()) {
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), pos, 0, st.data,
                                          st.context)
                        : PCRE2_ERROR_JIT_STACKLIMIT;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // No JIT, or a pathological input outgrew the JIT stack: the interpreter keeps its
      // backtracking state on the heap.
      rc = pcre2_match(impl_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       st.data, st.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      throw std::runtime_error(std::string("regex match failed: ") +
                               reinterpret_cast<const char*>(message));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t begin = ov[0], end = ov[1];
    if (end == begin && pos == last_match_end) {
      if (pos >= text.size()) return;
      ++pos;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (end > begin || with_empty) on_match(begin, end);
    pos = last_match_end = end;
  }
}

namespace {

// Oniguruma's Unicode classes, as HF's tokenizers answer them (probed code point by code point
// against tokenizers' Split): word characters (\w, and what \b looks at) are Alphabetic | Mark |
// Decimal_Number | Connector_Punctuation, plus the Latin-1 superscripts and fractions its Latin-1
// table marks as word; PCRE2's (10.42, UCP) are letters, all numbers and '_'.
const char kWordMembers[] = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";

// The members of Oniguruma's POSIX bracket [:name:] over Unicode, as PCRE2 class members; "" for
// a name whose meaning is PCRE2's too or not mapped (left for PCRE2 to take or refuse).
std::string posix_members(const std::string& name) {
  if (name == "alpha") return "\\p{Alphabetic}";
  if (name == "alnum") return "\\p{Alphabetic}\\p{Nd}";
  if (name == "digit") return "\\p{Nd}";
  if (name == "lower") return "\\p{Lowercase}";
  if (name == "upper") return "\\p{Uppercase}";
  if (name == "word") return kWordMembers;
  if (name == "xdigit") return "0-9A-Fa-f";
  if (name == "blank") return "\\p{Zs}\\t";
  if (name == "punct") return "\\p{P}\\p{S}";  // every symbol too (PCRE2: those below 256 only)
  return "";
}

[[noreturn]] void untranslatable(const std::string& pattern, const std::string& what) {
  throw std::invalid_argument("the Oniguruma pattern '" + pattern + "' uses " + what +
                              ", which PCRE2 cannot express the same way; refused rather than tokenize differently from HF");
}

}  // namespace

std::string Regex::translate_oniguruma(const std::string& pattern) {
  // HF's tokenizers compile tokenizer.json regexes with Oniguruma (Ruby syntax); PCRE2 reads the
  // same text differently in places, rewritten here (tests/tokenizer/make_variants.py compares
  // each against HF's tokenizers):
  //  - \s also matches U+0085 (NEL) in Oniguruma;
  //  - ^ and $ are line anchors (after / before every "\n", and at the text's ends); PCRE2's
  //    are the text's (its multiline mode differs again after a final "\n");
  //  - \h is a hex digit (PCRE2: horizontal space);
  //  - \w, \b and the POSIX brackets use Oniguruma's Unicode classes;
  //  - (?m) is dot-matches-newline (PCRE2: (?s)).
  // Nested classes and && intersections have no PCRE2 form and are refused.
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[++i];
      switch (n) {
        case 's': out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]"; break;
        case 'S':
          if (in_class) untranslatable(pattern, "\\S inside a character class");
          out += "[^\\s\\x{85}]";
          break;
        case 'h': out += in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]"; break;
        case 'H':
          if (in_class) untranslatable(pattern, "\\H inside a character class");
          out += "[^0-9A-Fa-f]";
          break;
        case 'w': out += in_class ? std::string(kWordMembers) : "[" + std::string(kWordMembers) + "]"; break;
        case 'W':
          if (in_class) untranslatable(pattern, "\\W inside a character class");
          out += "[^" + std::string(kWordMembers) + "]";
          break;
        case 'b':
        case 'B': {
          if (in_class) {  // a backspace in a class, as in PCRE2
            out += "\\b";
            break;
          }
          const std::string w = "[" + std::string(kWordMembers) + "]";
          const std::string boundary = "(?:(?<=" + w + ")(?!" + w + ")|(?<!" + w + ")(?=" + w + "))";
          out += n == 'b' ? boundary : "(?!" + boundary + ")";
          break;
        }
        case 'g':  // \g<name>: a subexpression call, recursion in PCRE2's matcher too
          if (i + 1 < pattern.size() && (pattern[i + 1] == '<' || pattern[i + 1] == '\'')) {
            untranslatable(pattern, "a subexpression call (\\g<...>)");
          }
          out += c;
          out += n;
          break;
        default:
          out += c;
          out += n;
      }
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
        const size_t close = pattern.find(":]", i + 2);
        if (close == std::string::npos) untranslatable(pattern, "an unterminated POSIX bracket");
        std::string name = pattern.substr(i + 2, close - i - 2);
        const bool negated = !name.empty() && name[0] == '^';
        if (negated) name.erase(0, 1);
        const std::string members = posix_members(name);
        if (members.empty()) {
          out += pattern.substr(i, close + 2 - i);  // PCRE2's own meaning (space, graph, print)
        } else if (negated) {
          untranslatable(pattern, "the negated POSIX bracket [:^" + name + ":]");
        } else {
          out += members;
        }
        i = close + 1;
        continue;
      }
      if (c == '[') untranslatable(pattern, "a nested character class");
      if (c == '&' && i + 1 < pattern.size() && pattern[i + 1] == '&') untranslatable(pattern, "a class intersection (&&)");
      if (c == ']') in_class = false;
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == '^') {
      out += "(?:^|(?<=\\n))";
      continue;
    }
    if (c == '$') {
      out += "(?=\\n|\\z)";
      continue;
    }
    // PCRE2's own constructs that Oniguruma (Ruby syntax) does not have: recursion and
    // subroutine calls ((?R), (?1), (?-1), (?&name), (?P>name)), callouts ((?C)) and verbs ((*...)).
    if (c == '(' && i + 1 < pattern.size() && pattern[i + 1] == '*') untranslatable(pattern, "a PCRE2 verb (*...)");
    if (c == '(' && i + 2 < pattern.size() && pattern[i + 1] == '?') {
      const char n = pattern[i + 2];
      const bool call = n == 'R' || n == '&' || n == 'C' || std::isdigit(static_cast<unsigned char>(n)) ||
                        ((n == '+' || n == '-') && i + 3 < pattern.size() && std::isdigit(static_cast<unsigned char>(pattern[i + 3]))) ||
                        (n == 'P' && i + 3 < pattern.size() && pattern[i + 3] == '>');
      if (call) untranslatable(pattern, "PCRE2 recursion, a subroutine call or a callout");
    }
    if (c == '(' && i + 2 < pattern.size() && pattern[i + 1] == '?' && std::isalpha(static_cast<unsigned char>(pattern[i + 2]))) {
      // Inline options (?imx-imx) or (?imx-imx:...): Ruby's m is PCRE2's s.
      size_t j = i + 2;
      std::string options;
      while (j < pattern.size() && (std::isalpha(static_cast<unsigned char>(pattern[j])) || pattern[j] == '-')) {
        options += pattern[j] == 'm' ? 's' : pattern[j];
        ++j;
      }
      if (j < pattern.size() && (pattern[j] == ':' || pattern[j] == ')')) {
        out += "(?" + options;
        i = j - 1;
        continue;
      }
    }
    out += c;
  }
  return out;
}

std::string Regex::escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace megatron::tok
