// `megatron _print-env`: a hidden subcommand for the launcher's tests. Prints this process's
// LaunchEnv as parsed, then misbehaves on request (fail, die by a signal, sleep, ignore
// SIGTERM) so the tests can drive every path of `megatron launch` with real processes.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <thread>

#include "cli/commands.h"
#include "core/errors.h"
#include "distributed/launch_env.h"
#include "distributed/launcher.h"

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
  // Rank -> seconds: when it prints "error: ..." on stderr, and when it then exits with
  // --exit-code (a cause that is reported late, or an effect that exits early).
  std::map<int, double> error_at, exit_at;
  // Rank -> a file it waits for before that error line (ordering ranks without the clock); every
  // rank that printed its error line then creates --touch-after-error.
  std::map<int, std::string> error_after_file;
  std::string touch_after_error;
  // "RANK=VALUE" -> (rank, value).
  const auto per_rank = [](const std::string& flag, const std::string& spec) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos) throw UserError(flag + " expects RANK=VALUE, got '" + spec + "'");
    return std::make_pair(int_value(flag, spec.substr(0, eq)), spec.substr(eq + 1));
  };
  const auto timed = [&](const std::string& flag, const std::string& spec, std::map<int, double>& into) {
    const auto [rank, seconds] = per_rank(flag, spec);
    into[rank] = std::atof(seconds.c_str());
  };
  int exit_code = 1, fail_signal = 0, lines = 0;
  double seconds = 0;
  bool ignore_sigterm = false, spawn_grandchild = false, probe_master_port = false;
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
    else if (flag == "--probe-master-port") probe_master_port = true;
    else if (flag == "--error-at") timed(flag, value(), error_at);
    else if (flag == "--exit-at") timed(flag, value(), exit_at);
    else if (flag == "--touch-after-error") touch_after_error = value();
    else if (flag == "--error-after-file") error_after_file.insert(per_rank(flag, value()));
    else throw UserError("unknown flag " + flag + " for `megatron _print-env`");
  }
  const dist::LaunchEnv env = dist::launch_env_from_environment();
  if (ignore_sigterm) std::signal(SIGTERM, SIG_IGN);
  std::printf("env %s pid=%d\n", dist::describe(env).c_str(), static_cast<int>(::getpid()));
  if (probe_master_port) {
    std::printf("rank %d: master port %d is %s\n", env.rank, env.master_port,
                dist::port_is_free(env.master_port) ? "free" : "taken");
  }
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
  if (error_at.count(env.rank) || exit_at.count(env.rank) || error_after_file.count(env.rank)) {
    const auto start = std::chrono::steady_clock::now();
    const auto wait_until = [&](double seconds) { std::this_thread::sleep_until(start + std::chrono::duration<double>(seconds)); };
    std::fflush(stdout);
    if (error_at.count(env.rank) || error_after_file.count(env.rank)) {
      if (error_at.count(env.rank)) wait_until(error_at[env.rank]);
      if (error_after_file.count(env.rank)) {
        while (::access(error_after_file[env.rank].c_str(), F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      std::fprintf(stderr, "error: rank %d's own failure\n", env.rank);
      if (!touch_after_error.empty()) std::fclose(std::fopen(touch_after_error.c_str(), "w"));
    }
    if (exit_at.count(env.rank)) {
      wait_until(exit_at[env.rank]);
      return exit_code;
    }
  }
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
