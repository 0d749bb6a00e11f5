// JSON read from files this program did not write (HF config.json, tokenizer.json, safetensors
// headers, state.json someone edited): parsed only after a scan bounds the nesting depth, since
// nlohmann's parser recurses once per level and a file nested ~100,000 deep overflows the stack.
// Errors are UserErrors naming the source and what is wrong.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace megatron {

// Deeper than any file of the formats read here (tokenizer.json nests about ten levels).
constexpr int kMaxJsonDepth = 512;

// UserError naming `source` when `text` nests arrays or objects deeper than kMaxJsonDepth
// (brackets inside strings do not count).
void check_json_depth(std::string_view text, const std::string& source);

// check_json_depth, then nlohmann::json::parse; a parse error becomes a UserError naming
// `source` and the byte where parsing stopped.
nlohmann::json parse_json_text(std::string_view text, const std::string& source);

// The file at `path` (read_file), parsed as above.
nlohmann::json parse_json_file(const std::string& path);

// `value` as an int64 when it is a JSON integer within int64's range; std::invalid_argument
// naming `what` otherwise. (nlohmann's get<int64_t>() converts a float such as 2e64 with
// undefined behaviour, and a string with a type error that names no field.)
int64_t json_to_int64(const nlohmann::json& value, const std::string& what);

}  // namespace megatron
