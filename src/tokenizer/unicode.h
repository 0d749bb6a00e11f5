// UTF-8 helpers the tokenizers share: decoding/encoding code points, making arbitrary bytes
// valid UTF-8 the way Rust's String::from_utf8_lossy does (HF decoders rely on it), GPT-2's
// byte-level alphabet (each byte <-> one printable code point), and Unicode normalization
// forms through utf8proc.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace megatron::tok {

// Decodes the code point starting at s[i]; advances i. Invalid sequences yield -1 and advance
// by the length of the maximal invalid prefix (at least one byte).
int32_t next_code_point(std::string_view s, size_t* i);

// The Unicode White_Space property (Rust's char::is_whitespace).
bool is_white_space(int32_t cp);

void append_utf8(std::string* out, uint32_t cp);

bool is_valid_utf8(std::string_view s);

// Replaces each maximal invalid subsequence with U+FFFD, as Rust's from_utf8_lossy.
std::string utf8_lossy(std::string_view s);

// GPT-2 byte-level alphabet.
class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& get();
  // The UTF-8 encoding of the code point standing for byte b.
  const std::string& encode_byte(uint8_t b) const { return byte_to_utf8_[b]; }
  // The byte a code point stands for, or -1 if it is not part of the alphabet.
  int byte_of(int32_t cp) const { return cp >= 0 && cp < 324 ? cp_to_byte_[cp] : -1; }
  // Maps every code point of s back to its byte; false if some code point is not in the
  // alphabet (then *out is unspecified).
  bool decode(std::string_view s, std::string* out) const;
  std::string encode(std::string_view bytes) const;

 private:
  ByteLevelAlphabet();
  std::string byte_to_utf8_[256];
  int16_t cp_to_byte_[324];
};

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };

// Normalizes valid UTF-8 text.
std::string normalize_unicode(std::string_view s, NormalForm form);

}  // namespace megatron::tok
