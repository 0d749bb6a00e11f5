#include <ftw.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "core/errors.h"
#include "fuzz_target.h"

namespace megatron::fuzz {
namespace {

struct Scratch {
  std::string dir;
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/megatron-fuzz-XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + dir);
  }
  // With whatever the targets wrote into it (files, checkpoint directories); links not followed.
  ~Scratch() {
    ::nftw(dir.c_str(), [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }, 16,
           FTW_DEPTH | FTW_PHYS);
  }
};

}  // namespace

void rejected(const std::exception& error) {
  static const bool verbose = std::getenv("MEGATRON_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "rejected: %s\n", error.what());
}

void exercise_tokenizer(const megatron::Tokenizer& tokenizer) {
  for (const char* text : {"Hello world!", "  two  spaces\n\ttab 12345", "caf\xc3\xa9 \xe6\x95\xb0 \xf0\x9f\x98\x80", "\xff\xfe",
                           "</s><s><|endoftext|>x", ""}) {
    std::vector<int64_t> ids;
    try {
      ids = tokenizer.encode(text);
    } catch (const megatron::UserError& e) {  // a damaged model may fail on a text (naming itself)
      rejected(e);
      continue;
    }
    for (int64_t id : ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();
      (void)tokenizer.id_to_token(id);
    }
    (void)tokenizer.decode(ids);
  }
  (void)tokenizer.decode({0, 1, 2, -1, tokenizer.vocab_size(), tokenizer.vocab_size() - 1});
}

std::string scratch_file(const std::string& name) {
  static Scratch scratch;
  return scratch.dir + "/" + name;
}

}  // namespace megatron::fuzz
