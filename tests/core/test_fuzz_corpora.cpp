// Every fuzz target (fuzz/fuzz_*.cpp, built into this binary) over every input of its corpus,
// fuzz/corpus/<target>/: the seeds, and each input a campaign found a crash, leak, hang or UB with
// (regression-*), kept once fixed. The campaigns themselves (scripts/fuzz.sh, clang + ASan +
// UBSan) are too long for CI; this keeps the targets building and every past finding fixed.
#include <dirent.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "fuzz_target.h"
#include "support/test_support.h"

namespace megatron {
namespace {

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    }
    ::closedir(d);
  }
  return names;
}

TEST(FuzzCorpora, EveryTargetIsRegisteredAndHasACorpus) {
  std::set<std::string> sources;
  for (const std::string& file : entries(test::source_dir() + "/fuzz")) {
    if (file.rfind("fuzz_", 0) == 0 && file.size() > 9 && file.substr(file.size() - 4) == ".cpp" && file != "fuzz_support.cpp") {
      sources.insert(file.substr(5, file.size() - 9));
    }
  }
  std::set<std::string> registered;
  for (const auto& [name, target] : fuzz::targets()) registered.insert(name);
  EXPECT_EQ(registered, sources);
  for (const std::string& name : sources) {
    EXPECT_FALSE(entries(test::source_dir() + "/fuzz/corpus/" + name).empty()) << "fuzz/corpus/" << name << " has no seeds";
  }
}

TEST(FuzzCorpora, EveryInputRunsCleanThroughItsTarget) {
  int inputs = 0;
  for (const auto& [name, target] : fuzz::targets()) {
    const std::string dir = test::source_dir() + "/fuzz/corpus/" + name;
    for (const std::string& file : entries(dir)) {
      std::ifstream in(dir + "/" + file, std::ios::binary);
      const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      try {
        target(bytes.data(), bytes.size());
      } catch (const std::exception& e) {  // a target lets only findings escape
        ADD_FAILURE() << "fuzz/corpus/" << name << "/" << file << ": " << e.what();
      }
      ++inputs;
    }
  }
  EXPECT_GE(inputs, 25);
}

}  // namespace
}  // namespace megatron
