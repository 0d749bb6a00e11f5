// PCRE2 wrapper; see regex.h.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <atomic>
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

Regex::~Regex() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

void Regex::for_each_match(std::string_view text,
                           const std::function<void(size_t, size_t)>& on_match) const {
  ThreadMatchState& st = thread_state();
  st.ensure(impl_->capture_pairs);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
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
    size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      on_match(begin, end);
      pos = end;
    } else {
      // Empty match: nothing to report as a split; step over one code point.
      if (begin >= text.size()) return;
      pos = begin + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
}

std::string Regex::translate_oniguruma(const std::string& pattern) {
  // Oniguruma's \s (HF's default regex engine) also matches U+0085 (NEL), which PCRE2's \s
  // does not; add it inside and outside character classes so splits agree.
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char n = pattern[i + 1];
      if (n == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (n == 'S') {
        out += in_class ? "\\S" : "[^\\s\\x{85}]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
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
