// Shared helpers for the tests: where the sources, the binary and the reference Python venv
// are, temporary directories, and running commands with their output captured.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron::test {

std::string source_dir();       // the repository root
std::string megatron_binary();  // the built `megatron`
// The venv's python (torch, transformers, tokenizers, megatron-core): $MEGATRON_VENV, else the
// first ~/.cache/megatron.cpp/venv-*. Empty if there is none; tests then fail, never skip.
std::string venv_python();

std::string shell_quote(const std::string& s);

struct CommandResult {
  int status = -1;     // exit status, or 128 + signal
  std::string output;  // stdout and stderr together
};
CommandResult run_command(const std::string& command);

// `megatron <args>` with output captured.
CommandResult run_megatron(const std::vector<std::string>& args);

// `train` on examples/tiny_cpu.yaml with mock data, on one CPU thread, then `extra`: the arguments
// of the tests' tiny runs.
std::vector<std::string> tiny_cpu_train(const std::vector<std::string>& extra);

// The "lm loss" of the log lines of a training run's output, in order: those of the iterations
// that are multiples of `interval` (Megatron also logs a run's first iteration, whatever the
// interval; with 1, every line).
std::vector<double> logged_losses(const std::string& output, int64_t interval = 1);

// max over i of |got[i] - want[i]| / |want[i]|, over the steps both have: how far one run's losses
// are from another's.
double largest_relative_difference(const std::vector<double>& got, const std::vector<double>& want);

// One key's value on each line of a --metrics-jsonl file ("lm_loss", "grad_norm", ...), in order;
// lines without the key are passed over.
std::vector<double> jsonl_series(const std::string& path, const std::string& key = "lm_loss");

// The directory of a real tokenizer the fixtures fetch (tests/fixtures/fetch_tokenizers.sh):
// `name` as "qwen3" -> .../tokenizer-qwen3/models. Empty if the fetch failed.
std::string tokenizer_models(const std::string& name);

// The lines of a text file (none if it cannot be read).
std::vector<std::string> file_lines(const std::string& path);

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace megatron::test
