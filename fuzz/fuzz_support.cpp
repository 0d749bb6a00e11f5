#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <stdexcept>

#include "fuzz_target.h"

namespace megatron::fuzz {
namespace {

struct Scratch {
  std::string dir;
  std::set<std::string> files;
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/megatron-fuzz-XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + dir);
  }
  ~Scratch() {
    for (const auto& f : files) ::unlink(f.c_str());
    ::rmdir(dir.c_str());
  }
};

}  // namespace

void rejected(const std::exception& error) {
  static const bool verbose = std::getenv("MEGATRON_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "rejected: %s\n", error.what());
}

std::string scratch_file(const std::string& name) {
  static Scratch scratch;
  const std::string path = scratch.dir + "/" + name;
  scratch.files.insert(path);
  return path;
}

}  // namespace megatron::fuzz
