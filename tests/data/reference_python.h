// Helpers for tests that compare against megatron-core / numpy running in the project venv:
// finding the venv and the source tree, running a reference script, temporary directories.
// A missing venv fails the test; it never skips it.
#pragma once

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

inline std::string source_dir() {
#ifdef MEGATRON_SOURCE_DIR
  return MEGATRON_SOURCE_DIR;
#else
  const char* env = std::getenv("MEGATRON_SOURCE_DIR");
  return env != nullptr ? env : ".";
#endif
}

// $MEGATRON_VENV when set and non-empty (CTest passes an empty one when unconfigured), else the
// first ~/.cache/megatron.cpp/venv-* holding megatron-core, else the first venv-* at all.
inline std::string venv_python() {
  const char* env = std::getenv("MEGATRON_VENV");
  if (env != nullptr && *env != '\0') return std::string(env) + "/bin/python";
  const char* home = std::getenv("HOME");
  if (home == nullptr) return "";
  std::string first, with_megatron;
  glob_t g;
  const std::string pattern = std::string(home) + "/.cache/megatron.cpp/venv-*";
  if (::glob(pattern.c_str(), GLOB_ONLYDIR, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      const std::string venv = g.gl_pathv[i];
      if (first.empty()) first = venv;
      glob_t m;
      const std::string probe = venv + "/lib/python*/site-packages/megatron/core/datasets";
      const bool has = ::glob(probe.c_str(), GLOB_ONLYDIR, nullptr, &m) == 0 && m.gl_pathc > 0;
      ::globfree(&m);
      if (has && with_megatron.empty()) with_megatron = venv;
    }
  }
  ::globfree(&g);
  const std::string venv = with_megatron.empty() ? first : with_megatron;
  return venv.empty() ? "" : venv + "/bin/python";
}

inline std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

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
