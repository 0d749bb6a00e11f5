#include <ftw.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

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

std::string scratch_file(const std::string& name) {
  static Scratch scratch;
  return scratch.dir + "/" + name;
}

}  // namespace megatron::fuzz
