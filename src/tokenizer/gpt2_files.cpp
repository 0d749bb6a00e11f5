// GPT-2's original tokenizer files, vocab.json (token -> id) and merges.txt ("a b" per line
// after a "#version" header), as Megatron's GPT2BPETokenizer reads them.
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "core/json_text.h"
#include "tokenizer/hf_tokenizer.h"

namespace megatron::tok {

namespace {

std::string read_flag_file(const std::string& path, const char* flag) {
  struct stat st {};
  if (path.empty()) throw UserError(std::string(flag) + " is required by --tokenizer-type GPT2BPETokenizer");
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    throw UserError(std::string(flag) + " " + path + ": no such file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(std::string(flag) + " " + path + ": cannot open the file for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::unique_ptr<HfTokenizer> load_gpt2_files(const std::string& vocab_file,
                                             const std::string& merge_file) {
  const std::string vocab_text = read_flag_file(vocab_file, "--vocab-file");
  const std::string merges_text = read_flag_file(merge_file, "--merge-file");

  std::vector<std::pair<std::string, int64_t>> vocab;
  check_json_depth(vocab_text, "--vocab-file " + vocab_file);
  try {
    nlohmann::json j = nlohmann::json::parse(vocab_text);
    if (!j.is_object()) throw UserError("not a JSON object");
    for (const auto& [token, id] : j.items()) vocab.emplace_back(token, json_to_int64(id, "the id of '" + token + "'"));
  } catch (const std::exception& e) {
    throw UserError("--vocab-file " + vocab_file + ": expected GPT-2's vocab.json (a JSON object "
                    "token -> id): " + e.what());
  }

  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream lines(merges_text);
  std::string line;
  for (size_t number = 1; std::getline(lines, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (number == 1 && line.rfind("#version", 0) == 0)) continue;
    size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      throw UserError("--merge-file " + merge_file + ":" + std::to_string(number) +
                      ": expected two tokens separated by one space (GPT-2's merges.txt)");
    }
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }

  HfParts parts;
  parts.pre_tokenizer = PreTokenizer::gpt2();
  BpeOptions options;
  options.byte_level = true;
  try {
    parts.model = std::make_unique<BpeModel>(vocab, merges, options);
  } catch (const std::invalid_argument& e) {
    throw UserError("--merge-file " + merge_file + " does not match --vocab-file " + vocab_file +
                    ": " + e.what());
  }
  parts.decoder = Decoder::byte_level();
  int64_t eod = parts.model->token_to_id("<|endoftext|>");
  if (eod >= 0) parts.eos = eod;
  return std::make_unique<HfTokenizer>(std::move(parts));
}

}  // namespace megatron::tok
