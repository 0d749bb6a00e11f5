#include "core/json_text.h"

#include <cstdint>
#include <stdexcept>

#include "core/errors.h"
#include "core/files.h"

namespace megatron {

void check_json_depth(std::string_view text, const std::string& source) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        throw UserError(source + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels (at byte " +
                        std::to_string(i) + "); no file of this kind nests so deep: it is corrupt or not what it claims to be");
      }
    } else if (c == ']' || c == '}') {
      --depth;  // unbalanced text is the parser's to report
    }
  }
}

nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  check_json_depth(text, source);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number past double's range (1e400)
    throw UserError(source + ": not valid JSON (" + e.what() + ")");
  }
}

nlohmann::json parse_json_file(const std::string& path) { return parse_json_text(read_file(path), path); }

int64_t json_to_int64(const nlohmann::json& value, const std::string& what) {
  if (value.is_number_unsigned() && value.get<uint64_t>() <= uint64_t(INT64_MAX)) return int64_t(value.get<uint64_t>());
  if (value.is_number_integer() && !value.is_number_unsigned()) return value.get<int64_t>();
  throw std::invalid_argument(what + " must be an integer within 64 bits, got " + value.dump());
}

}  // namespace megatron
