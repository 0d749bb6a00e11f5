// One fuzz target per file, fuzz/fuzz_<name>.cpp:
//
//   MEGATRON_FUZZ_TARGET(name) { ... use data, size ... }
//
// Built by scripts/fuzz.sh with clang's libFuzzer, ASan and UBSan (-DMEGATRON_LIBFUZZER), the
// body is LLVMFuzzerTestOneInput. Built into the test binary, it is registered by name and
// tests/core/test_fuzz_corpora.cpp runs every input of fuzz/corpus/<name>/ (the seeds and each
// crash a campaign found) through it, so the targets build, run and stay fixed in CI.
//
// A body catches only the errors a parser may answer bad input with (UserError and those its
// header documents). Anything else escaping it -- an internal error, a crash, a hang -- is a
// finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace megatron::fuzz {

using Target = void (*)(const uint8_t* data, size_t size);

inline std::map<std::string, Target>& targets() {
  static std::map<std::string, Target> all;
  return all;
}

struct Registration {
  Registration(const char* name, Target target) { targets()[name] = target; }
};

inline std::string_view as_text(const uint8_t* data, size_t size) { return {reinterpret_cast<const char*>(data), size}; }

// The input split at its first occurrence of `separator` (absent: all of it first, "" second):
// two files or fields from one input.
inline std::pair<std::string_view, std::string_view> split(std::string_view text, std::string_view separator) {
  const size_t at = text.find(separator);
  if (at == std::string_view::npos) return {text, {}};
  return {text.substr(0, at), text.substr(at + separator.size())};
}

// Called with each error a parser answered an input with: printed when MEGATRON_FUZZ_VERBOSE is
// set (is a seed accepted, or refused before reaching the code it was written for?).
void rejected(const std::exception& error);

// A tokenizer a target loaded, used as training uses it: a few texts (ASCII, whitespace runs,
// multi-byte and invalid UTF-8, special-token strings, empty) encoded, every id checked to lie
// inside the vocabulary (a finding otherwise) and named, then decoded, and ids outside it decoded.
// A UserError from encode (a damaged model that fails on a text, naming itself) is an answer.
void exercise_tokenizer(const megatron::Tokenizer& tokenizer);

// A scratch directory for targets whose parser reads files (one per process, reused by every run).
std::string scratch_file(const std::string& name);

}  // namespace megatron::fuzz

#ifdef MEGATRON_LIBFUZZER
#define MEGATRON_FUZZ_TARGET(name)                                                    \
  static void megatron_fuzz_body(const uint8_t* data, size_t size);                  \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {          \
    megatron_fuzz_body(data, size);                                                    \
    return 0;                                                                          \
  }                                                                                    \
  static void megatron_fuzz_body(const uint8_t* data, size_t size)
#else
#define MEGATRON_FUZZ_TARGET(name)                                                                           \
  static void megatron_fuzz_body_##name(const uint8_t* data, size_t size);                                  \
  static const ::megatron::fuzz::Registration megatron_fuzz_registration_##name(#name, megatron_fuzz_body_##name); \
  static void megatron_fuzz_body_##name(const uint8_t* data, size_t size)
#endif
