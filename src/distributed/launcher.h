// `megatron launch`: torchrun's static launcher for this binary. Starts one child process per
// local rank running `megatron <subcommand> [args]` with RANK, WORLD_SIZE, LOCAL_RANK, ...
// set, prefixes their output with "[rank R] ", forwards SIGINT/SIGTERM, and stops the whole
// node's job when one rank fails, reporting which one and how.
#pragma once

#include <string>
#include <vector>

namespace megatron::dist {

struct LaunchOptions {
  int nproc_per_node = 0;  // required
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // 0: pick a free port (single node only)
  std::string log_dir;      // non-empty: also write <log_dir>/rank_<R>.log per rank
  double kill_timeout_s = 5.0;  // SIGTERM -> SIGKILL grace when stopping ranks
  // A running rank silent this long (heartbeat.h) is stopped or frozen; 0: not watched. At most
  // half the command's --distributed-timeout-minutes unless given.
  double heartbeat_timeout_s = 60.0;
  bool prefix_rank0 = true;     // false: rank 0's lines appear unprefixed (`--no-prefix-rank0`)
  std::vector<std::string> command;  // the subcommand and its arguments, passed on verbatim
  bool help = false;                 // `--help` came before the subcommand; nothing else is checked
};

// Parses `megatron launch` flags up to the subcommand; everything from the first non-flag
// word (or after `--`) is the command. Throws UserError naming the flag on bad input.
LaunchOptions parse_launch_arguments(const std::vector<std::string>& args);

std::string launch_help();

// Runs the ranks of this node to completion. `program` is what each child executes (the
// running binary by default). Returns the launcher's exit status: 0 when every rank exited 0,
// 1 when a rank failed, 128 + signal when the launcher was interrupted.
int run_launch(const LaunchOptions& options, const std::string& program = "/proc/self/exe");

// A TCP socket listening on a free port of this node (into `port`), for rank 0's store to serve
// on (LaunchEnv::master_listen_fd). Throws UserError when none can be had.
int listen_on_free_port(int& port);

// Whether a TCP store could bind `port` on this node now (a port in TIME_WAIT counts as free).
bool port_is_free(int port);

}  // namespace megatron::dist
