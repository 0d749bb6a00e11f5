// Single-thread tokenizer throughput: encodes each line of a text file, one call per line
// (as a preprocessing worker does per document), and reports MB/s and tokens/s.
//   tokenizer_bench --tokenizer-type T [--tokenizer-model P] [--vocab-file V --merge-file M]
//                   --input lines.txt [--repeat N]
// Prints one line of JSON: bytes, lines, tokens, seconds, MB/s, tokens/s, load seconds, and a
// checksum of the ids so runs can be compared with the HF reference.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "core/errors.h"
#include "tokenizer/tokenizer.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string type, model, vocab, merges, input;
  int repeat = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--tokenizer-type") type = value;
    else if (flag == "--tokenizer-model") model = value;
    else if (flag == "--vocab-file") vocab = value;
    else if (flag == "--merge-file") merges = value;
    else if (flag == "--input") input = value;
    else if (flag == "--repeat") repeat = std::stoi(value);
    else {
      std::fprintf(stderr, "error: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  std::vector<std::string> lines;
  size_t bytes = 0;
  {
    std::ifstream in(input);
    if (!in) {
      std::fprintf(stderr, "error: cannot read --input %s\n", input.c_str());
      return 2;
    }
    for (std::string line; std::getline(in, line);) {
      bytes += line.size();
      lines.push_back(std::move(line));
    }
  }
  try {
    auto t_load = std::chrono::steady_clock::now();
    auto tok = megatron::make_tokenizer(type, model, vocab, merges, 0);
    double load_s = seconds_since(t_load);
    size_t tokens = 0;
    uint64_t checksum = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < repeat; ++r) {
      for (const std::string& line : lines) {
        std::vector<int64_t> ids = tok->encode(line, false);
        tokens += ids.size();
        for (int64_t id : ids) checksum = checksum * 1000003u + static_cast<uint64_t>(id);
      }
    }
    double s = seconds_since(t0);
    double total_bytes = static_cast<double>(bytes) * repeat;
    std::printf("{\"impl\": \"megatron.cpp\", \"bytes\": %.0f, \"lines\": %zu, \"tokens\": %zu, "
                "\"seconds\": %.3f, \"MB_per_s\": %.2f, \"tokens_per_s\": %.0f, \"load_s\": %.2f, "
                "\"checksum\": %llu}\n",
                total_bytes, lines.size() * repeat, tokens, s, total_bytes / s / 1e6, tokens / s, load_s,
                static_cast<unsigned long long>(checksum));
  } catch (const megatron::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
