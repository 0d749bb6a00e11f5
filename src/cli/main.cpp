// `megatron <subcommand> [flags]`: dispatch and top-level help; the subcommand runs under
// cli::run_reporting_errors, where user errors become "error: ..." on stderr with exit status 2.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <string>

#include "cli/commands.h"
#include "distributed/launch_env.h"

namespace {

struct Subcommand {
  std::function<int(const megatron::cli::Args&)> run;
  const char* summary;
};

const std::map<std::string, Subcommand>& subcommands() {
  static const std::map<std::string, Subcommand> table = {
      {"train", {megatron::cli::train, "pre-train or fine-tune a model"}},
      {"launch", {megatron::cli::launch, "start N ranks of a subcommand (like torchrun)"}},
      {"preprocess", {megatron::cli::preprocess, "turn JSONL into Megatron .bin/.idx datasets"}},
      {"convert", {megatron::cli::convert, "convert checkpoints to and from Hugging Face safetensors"}},
      {"generate", {megatron::cli::generate, "sample text from a checkpoint"}},
      {"serve", {megatron::cli::serve, "serve a checkpoint over HTTP with the OpenAI API"}},
      {"eval", {megatron::cli::eval, "evaluate a checkpoint on the validation and test splits"}},
      {"plan", {megatron::cli::plan_layouts, "plan a parallel layout for a cluster (memory and time of each)"}},
      {"version", {megatron::cli::version, "print the version and the LibTorch it runs on"}},
      // Names starting with '_' are for tests and never listed.
      {"_print-env", {megatron::cli::print_env, "print the parsed launch environment"}},
  };
  return table;
}

void print_usage(std::FILE* out) {
  std::fprintf(out, "usage: megatron <subcommand> [flags]   (megatron <subcommand> --help for its flags)\n\nsubcommands:\n");
  for (const auto& [name, sub] : subcommands()) {
    if (name.front() == '_') continue;
    std::fprintf(out, "  %-11s %s\n", name.c_str(), sub.summary);
  }
}

// The training scripts of Megatron-LM (pretrain_gpt.py) and Pai-Megatron-Patch (its GPT-style
// models' pretrain_*.py) that `megatron train` stands in for, so that a launch line changes only
// the program: `torchrun --no-python megatron pretrain_gpt.py ARGS`.
const char* const kGptScripts[] = {"pretrain_gpt.py", "pretrain_llama.py", "pretrain_qwen.py", "pretrain_mcore_qwen.py",
                                   "pretrain_qwen2_moe.py", "pretrain_deepseek.py"};

std::string gpt_scripts_list() {
  std::string out;
  for (const char* s : kGptScripts) out += (out.empty() ? "" : ", ") + std::string(s);
  return out;
}

// The script's file name when `arg` (a path or a name) is one of them, else "".
std::string megatron_script(const std::string& arg) {
  const size_t slash = arg.rfind('/');
  const std::string base = slash == std::string::npos ? arg : arg.substr(slash + 1);
  for (const char* s : kGptScripts) {
    if (base == s) return base;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  megatron::cli::set_up_under_launch();
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string name = argv[1];
  const std::string script = megatron_script(name);
  if (!script.empty()) {
    name = "train";
  } else if (name.size() > 3 && name.compare(name.size() - 3, 3, ".py") == 0) {
    std::fprintf(stderr, "error: %s is not a script megatron.cpp stands in for; it stands in for %s (as `megatron train`)\n",
                 name.c_str(), gpt_scripts_list().c_str());
    return 2;
  }
  auto it = subcommands().find(name);
  if (it == subcommands().end()) {
    std::fprintf(stderr, "error: unknown subcommand '%s'\n", name.c_str());
    print_usage(stderr);
    return 2;
  }
  const megatron::cli::Args args(argv + 2, argv + argc);
  return megatron::cli::run_reporting_errors([&] {
    // Rank 0 of the launch environment the trainer reads (its malformed variables are user errors).
    if (!script.empty() && megatron::dist::launch_env_from_environment().rank == 0) {
      std::printf("> note: %s runs as `megatron train`\n", script.c_str());
    }
    return it->second.run(args);
  });
}
