// Small text helpers several rooms share.
#pragma once

#include <string>

namespace megatron {

// Python's str.strip() for ASCII text: leading and trailing " \t\n\r\f\v" removed.
inline std::string strip_whitespace(const std::string& s) {
  const char* space = " \t\n\r\f\v";
  const size_t first = s.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(space) - first + 1);
}

}  // namespace megatron
