// Helpers for tests that compare against megatron-core / numpy running in the project venv:
// finding the venv and the source tree, running a reference script, temporary directories.
// A missing venv fails the test; it never skips it.
#pragma once

#include "support/test_support.h"

#include <dirent.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace megatron {
namespace reference {

inline bool path_exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

inline std::string source_dir() { return test::source_dir(); }

inline std::string venv_python() { return test::venv_python(); }

inline std::string shell_quote(const std::string& s) { return test::shell_quote(s); }

// Runs tests/data/<script> with args in the venv. Returns "" on success, else why it failed, for
// the caller to assert on in every test (a failed reference fails the tests, never skips them;
// gtest would skip a suite whose SetUpTestSuite asserted).
inline std::string run_reference_script(const std::string& script_name, const std::string& args) {
  const std::string python = venv_python();
  if (python.empty()) {
    return "no Python venv for the reference check: set MEGATRON_VENV or create "
           "~/.cache/megatron.cpp/venv-* from the project's requirements (numpy, torch, megatron-core)";
  }
  if (!path_exists(python)) return python + " does not exist; set MEGATRON_VENV to the project venv";
  const std::string script = source_dir() + "/tests/data/" + script_name;
  if (!path_exists(script)) {
    return script + " not found; build with -DMEGATRON_SOURCE_DIR=<repo> or set MEGATRON_SOURCE_DIR to the "
                    "repository root";
  }
  const std::string cmd = shell_quote(python) + " " + shell_quote(script) + " " + args + " 2>&1";
  if (std::system(cmd.c_str()) != 0) return "reference script failed (output above): " + cmd;
  return "";
}

inline std::string make_temp_dir(const std::string& tag) {
  std::string tmpl = "/tmp/" + tag + "_XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return "";
  return buf.data();
}

inline void remove_tree(const std::string& path) {
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      const std::string child = path + "/" + name;
      struct stat st {};
      if (::lstat(child.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        remove_tree(child);
      } else {
        ::unlink(child.c_str());
      }
    }
    ::closedir(d);
  }
  ::rmdir(path.c_str());
}

inline std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
  }
  return names;
}

inline std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace reference
}  // namespace megatron
