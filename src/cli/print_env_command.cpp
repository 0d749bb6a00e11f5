// `megatron _print-env`: a hidden subcommand for the launcher's tests. Prints this process's
// LaunchEnv as parsed, then misbehaves on request (fail, die by a signal, sleep, ignore
// SIGTERM) so the tests can drive every path of `megatron launch` with real processes.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cli/commands.h"
#include "core/errors.h"
#include "distributed/launch_env.h"

namespace megatron::cli {
namespace {

int int_value(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0') throw UserError(flag + " expects an integer, got '" + value + "'");
  return static_cast<int>(v);
}

// "all", or a comma-separated list of ranks.
bool rank_selected(const std::string& spec, int rank) {
  if (spec == "all") return true;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    if (comma == std::string::npos) comma = spec.size();
    if (int_value("rank list", spec.substr(start, comma - start)) == rank) return true;
    start = comma + 1;
  }
  return false;
}

}  // namespace

int print_env(const Args& args) {
  std::string fail_rank, sleep_rank, stderr_message;
  int exit_code = 1, fail_signal = 0, lines = 0;
  double seconds = 0;
  bool ignore_sigterm = false, spawn_grandchild = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    const auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw UserError(flag + " expects a value");
      return args[++i];
    };
    if (flag == "--fail-rank") fail_rank = value();
    else if (flag == "--exit-code") exit_code = int_value(flag, value());
    else if (flag == "--fail-signal") fail_signal = int_value(flag, value());
    else if (flag == "--sleep-rank") sleep_rank = value();
    else if (flag == "--seconds") seconds = std::atof(value().c_str());
    else if (flag == "--stderr-message") stderr_message = value();
    else if (flag == "--lines") lines = int_value(flag, value());
    else if (flag == "--ignore-sigterm") ignore_sigterm = true;
    else if (flag == "--spawn-grandchild") spawn_grandchild = true;
    else throw UserError("unknown flag " + flag + " for `megatron _print-env`");
  }
  const dist::LaunchEnv env = dist::launch_env_from_environment();
  if (ignore_sigterm) std::signal(SIGTERM, SIG_IGN);
  std::printf("env %s pid=%d\n", dist::describe(env).c_str(), static_cast<int>(::getpid()));
  for (int k = 1; k <= lines; ++k) std::printf("line %d of rank %d\n", k, env.rank);
  if (spawn_grandchild) {
    // A descendant the rank never waits for: only killing the rank's process group stops it.
    std::fflush(stdout);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::sleep(60);
      ::_exit(0);
    }
    std::printf("grandchild pid=%d\n", static_cast<int>(pid));
  }
  if (!stderr_message.empty()) std::fprintf(stderr, "%s\n", stderr_message.c_str());
  if (!fail_rank.empty() && rank_selected(fail_rank, env.rank)) {
    std::fflush(stdout);
    if (fail_signal != 0) {
      std::fprintf(stderr, "rank %d: raising signal %d on purpose\n", env.rank, fail_signal);
      std::signal(fail_signal, SIG_DFL);
      std::raise(fail_signal);
    }
    std::fprintf(stderr, "rank %d: failing on purpose with exit code %d\n", env.rank, exit_code);
    return exit_code;
  }
  if (!sleep_rank.empty() && rank_selected(sleep_rank, env.rank)) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }
  return 0;
}

}  // namespace megatron::cli
