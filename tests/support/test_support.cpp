#include "support/test_support.h"

#include <ftw.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <stdexcept>

#include "distributed/world.h"

namespace megatron::test {
namespace fs = std::filesystem;

namespace {
// Before main and any thread: the tests run ranks as threads of one process (distributed/world.h).
const bool flight_recorder_off = (dist::turn_off_flight_recorder_unless_asked(), true);
}  // namespace

std::string source_dir() {
#ifdef MEGATRON_SOURCE_DIR
  return MEGATRON_SOURCE_DIR;
#else
  const char* env = std::getenv("MEGATRON_SOURCE_DIR");
  return env ? env : ".";
#endif
}

std::string megatron_binary() {
#ifdef MEGATRON_BINARY
  return MEGATRON_BINARY;
#else
  return source_dir() + "/build/megatron";
#endif
}

std::string venv_python() {
  if (const char* env = std::getenv("MEGATRON_VENV"); env != nullptr && *env != '\0') {
    return std::string(env) + "/bin/python";
  }
  const char* home = std::getenv("HOME");
  const fs::path cache = fs::path(home ? home : "/root") / ".cache/megatron.cpp";
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(cache, ec)) {
    if (entry.path().filename().string().rfind("venv-", 0) == 0 && fs::exists(entry.path() / "bin/python")) {
      found.push_back((entry.path() / "bin/python").string());
    }
  }
  std::sort(found.begin(), found.end());
  return found.empty() ? "" : found.front();
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed: " + command);
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

CommandResult run_megatron(const std::vector<std::string>& args) {
  std::string command = shell_quote(megatron_binary());
  for (const auto& a : args) command += " " + shell_quote(a);
  return run_command(command);
}

std::vector<std::string> tiny_cpu_train(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"train", "--config", source_dir() + "/examples/tiny_cpu.yaml", "--mock-data", "--cpu-threads", "1",
                                   "--device", "cpu"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// POSIX calls, not std::filesystem: in the GPU machine's image, std::filesystem calls made by
// the test binary crashed (docs/performance.md), taking every suite with a TempDir with them.
TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/megatron-test-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + pattern);
  path_ = pattern;
}

TempDir::~TempDir() {
  // Depth first, links not followed: files before their directories.
  ::nftw(path_.c_str(), [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }, 16,
         FTW_DEPTH | FTW_PHYS);
}

std::vector<std::string> file_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::vector<double> jsonl_series(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::vector<double> values;
  const std::regex pattern("\"" + key + R"(": ([0-9.eE+-]+|NaN|nan|Infinity|-Infinity))");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, pattern)) values.push_back(std::stod(m[1]));
  }
  return values;
}

std::string tokenizer_models(const std::string& name) {
  const CommandResult fetched =
      run_command("bash " + shell_quote(source_dir() + "/tests/fixtures/fetch_tokenizers.sh") + " 2>/dev/null | tail -1");
  if (fetched.status != 0 || fetched.output.empty()) return "";
  return fetched.output.substr(0, fetched.output.find('\n')) + "/tokenizer-" + name + "/models";
}

double largest_relative_difference(const std::vector<double>& got, const std::vector<double>& want) {
  double largest = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) largest = std::max(largest, std::abs(got[i] - want[i]) / std::abs(want[i]));
  return largest;
}

std::vector<double> logged_losses(const std::string& output, int64_t interval) {
  std::vector<double> losses;
  std::regex pattern(R"( iteration +([0-9]+)/ *[0-9]+ \|[^\n]*\| lm loss: ([0-9.E+-]+) \|)");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), pattern); it != std::sregex_iterator(); ++it) {
    if (std::stoll((*it)[1]) % interval == 0) losses.push_back(std::stod((*it)[2]));
  }
  return losses;
}

}  // namespace megatron::test
