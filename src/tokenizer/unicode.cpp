// UTF-8 and byte-level helpers; see unicode.h.
#include "tokenizer/unicode.h"

#include <cstdlib>
#include <stdexcept>

#include <utf8proc.h>

namespace megatron::tok {

int32_t next_code_point(std::string_view s, size_t* i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t k = *i;
  unsigned char c = p[k];
  if (c < 0x80) {
    *i = k + 1;
    return c;
  }
  int len;
  uint32_t cp;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte (rejects overlongs, surrogates)
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    *i = k + 1;
    return -1;
  }
  for (int j = 1; j < len; ++j) {
    unsigned char b = k + j < n ? p[k + j] : 0;
    bool ok = j == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      *i = k + j;  // the maximal invalid prefix ends before b
      return -1;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  *i = k + len;
  return static_cast<int32_t>(cp);
}

bool is_white_space(int32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // Skip ASCII eight bytes at a time: most text is mostly ASCII.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) break;
    if (next_code_point(s, &i) < 0) return false;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    int32_t cp = next_code_point(s, &i);
    if (cp < 0) {
      out += "\xEF\xBF\xBD";
    } else {
      out.append(s.data() + start, i - start);
    }
  }
  return out;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  for (auto& v : cp_to_byte_) v = -1;
  int next_extra = 0;
  for (int b = 0; b < 256; ++b) {
    // Printable Latin-1 bytes stand for themselves; the other 68 bytes, in increasing order,
    // get U+0100 onward, so every byte becomes a visible, non-space character.
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    int cp = printable ? b : 256 + next_extra++;
    cp_to_byte_[cp] = static_cast<int16_t>(b);
    append_utf8(&byte_to_utf8_[b], static_cast<uint32_t>(cp));
  }
}

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

bool ByteLevelAlphabet::decode(std::string_view s, std::string* out) const {
  out->clear();
  size_t i = 0;
  while (i < s.size()) {
    int b = byte_of(next_code_point(s, &i));
    if (b < 0) return false;
    out->push_back(static_cast<char>(b));
  }
  return true;
}

std::string ByteLevelAlphabet::encode(std::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += byte_to_utf8_[b];
  return out;
}

std::string normalize_unicode(std::string_view s, NormalForm form) {
  // No normal form changes ASCII, and NFC changes nothing below U+0300 (only combining marks
  // and later scripts compose): skip utf8proc for such text, the common case.
  const unsigned char limit = form == NormalForm::kNFC ? 0xCC : 0x80;
  bool trivial = true;
  for (unsigned char c : s) {
    if (c >= limit) {
      trivial = false;
      break;
    }
  }
  if (trivial) return std::string(s);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* result = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &result,
                                    static_cast<utf8proc_option_t>(options));
  if (n < 0) {
    // Only invalid UTF-8 fails, and the tokenizer makes its input valid first.
    return std::string(s);
  }
  std::string out(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
  std::free(result);
  return out;
}

}  // namespace megatron::tok
