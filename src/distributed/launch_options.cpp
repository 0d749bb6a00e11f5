// `megatron launch` flags: parsing, validation and the help text. Kept apart from the process
// management in launcher.cpp so each file stays about one thing.
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <algorithm>

#include <yaml-cpp/yaml.h>

#include "core/errors.h"
#include "distributed/launcher.h"

namespace megatron::dist {
namespace {

int parse_int_flag(const std::string& flag, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || end != value.c_str() + value.size() || errno == ERANGE || v < INT_MIN || v > INT_MAX) {
    throw UserError(flag + " expects an integer, got '" + value + "'");
  }
  return static_cast<int>(v);
}

double parse_seconds_flag(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  // At most a day: beyond that the seconds overflow the clocks they become (1e12 once SIGKILLed at once).
  if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(v) || v < 0 || v > 86400) {
    throw UserError(flag + " expects a number of seconds from 0 to 86400, got '" + value + "'");
  }
  return v;
}

// torchrun spells its flags both --nproc-per-node and --nproc_per_node; accept both so its
// scripts port by changing the program name.
std::string normalize_flag(std::string flag) {
  for (size_t i = 2; i < flag.size(); ++i) {
    if (flag[i] == '_') flag[i] = '-';
  }
  return flag;
}

// A positive finite number of minutes, else nothing (the rank itself reports a bad value).
std::optional<double> positive_minutes(const std::string& value) {
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (!value.empty() && *end == '\0' && std::isfinite(v) && v > 0) return v;
  return std::nullopt;
}

// The recipe's distributed-timeout-minutes (either spelling), when the file reads as YAML; any
// problem with it is the rank's to report.
std::optional<double> recipe_timeout_minutes(const std::string& path) {
  try {
    const YAML::Node recipe = YAML::LoadFile(path);
    if (!recipe.IsMap()) return std::nullopt;
    for (const char* key : {"distributed-timeout-minutes", "distributed_timeout_minutes"}) {
      if (recipe[key] && recipe[key].IsScalar()) return positive_minutes(recipe[key].Scalar());
    }
  } catch (const YAML::Exception&) {
  }
  return std::nullopt;
}

// The launched command's --distributed-timeout-minutes: on its command line, else in its
// --config recipe (the command line wins, as train reads them).
std::optional<double> distributed_timeout_minutes(const std::vector<std::string>& command) {
  std::optional<double> from_flags, from_recipe;
  auto value_of = [&](size_t& i, const std::string& flag) -> std::optional<std::string> {
    if (command[i] == flag && i + 1 < command.size()) return command[++i];
    if (command[i].rfind(flag + "=", 0) == 0) return command[i].substr(flag.size() + 1);
    return std::nullopt;
  };
  for (size_t i = 0; i < command.size(); ++i) {
    if (const auto v = value_of(i, "--distributed-timeout-minutes")) {
      from_flags = positive_minutes(*v);
    } else if (const auto path = value_of(i, "--config")) {
      from_recipe = recipe_timeout_minutes(*path);
    }
  }
  return from_flags ? from_flags : from_recipe;
}

}  // namespace

LaunchOptions parse_launch_arguments(const std::vector<std::string>& args) {
  LaunchOptions o;
  bool node_rank_given = false, nproc_given = false, standalone = false, heartbeat_given = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.rfind("--", 0) != 0) break;  // the subcommand: the rest belongs to it
    std::string flag = arg;
    std::string value;
    bool has_inline_value = false;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_inline_value = true;
    }
    flag = normalize_flag(flag);
    const auto take_value = [&]() -> std::string {
      if (has_inline_value) return value;
      if (i + 1 >= args.size()) throw UserError(flag + " expects a value");
      return args[++i];
    };
    const auto no_value = [&] {
      if (has_inline_value) throw UserError(flag + " takes no value");
    };
    if (flag == "--help") {
      no_value();
      o.help = true;
      return o;
    } else if (flag == "--nproc-per-node") {
      const std::string v = take_value();
      o.nproc_per_node = parse_int_flag(flag, v);
      if (o.nproc_per_node < 1) throw UserError("--nproc-per-node must be at least 1, got " + v);
      nproc_given = true;
    } else if (flag == "--nnodes") {
      const std::string v = take_value();
      if (v.find(':') != std::string::npos) {
        throw UserError("--nnodes " + v + ": elastic node ranges are not supported; give a fixed node count");
      }
      o.nnodes = parse_int_flag(flag, v);
      if (o.nnodes < 1) throw UserError("--nnodes must be at least 1, got " + v);
    } else if (flag == "--node-rank") {
      o.node_rank = parse_int_flag(flag, take_value());
      node_rank_given = true;
    } else if (flag == "--master-addr") {
      o.master_addr = take_value();
      if (o.master_addr.empty()) throw UserError("--master-addr expects a host name or address, got ''");
    } else if (flag == "--master-port") {
      const std::string v = take_value();
      o.master_port = parse_int_flag(flag, v);
      if (o.master_port < 0 || o.master_port > 65535) {
        throw UserError("--master-port " + v + " is not a TCP port (1..65535, or 0 to pick a free one)");
      }
    } else if (flag == "--standalone") {
      no_value();
      standalone = true;
    } else if (flag == "--log-dir") {
      o.log_dir = take_value();
      if (o.log_dir.empty()) throw UserError("--log-dir expects a directory, got ''");
    } else if (flag == "--kill-timeout") {
      o.kill_timeout_s = parse_seconds_flag(flag, take_value());
    } else if (flag == "--heartbeat-timeout") {
      const std::string v = take_value();
      o.heartbeat_timeout_s = parse_seconds_flag(flag, v);
      heartbeat_given = true;
      if (o.heartbeat_timeout_s > 0 && o.heartbeat_timeout_s < 3) {
        throw UserError("--heartbeat-timeout " + v + ": ranks beat once a second; give at least 3 s, or 0 to not watch them");
      }
    } else if (flag == "--no-prefix-rank0") {
      no_value();
      o.prefix_rank0 = false;
    } else if (flag == "--no-python") {
      no_value();  // torchrun's flag; `megatron launch` never runs Python anyway
    } else if (flag.rfind("--rdzv", 0) == 0 || flag == "--max-restarts" || flag == "--monitor-interval") {
      throw UserError(flag + " (torchrun's elastic rendezvous) is not supported by `megatron launch`; use "
                      "--nnodes/--node-rank/--master-addr/--master-port");
    } else {
      throw UserError("unknown flag " + arg + " for `megatron launch` (see `megatron launch --help`)");
    }
  }
  o.command.assign(args.begin() + static_cast<long>(i), args.end());

  if (!nproc_given) throw UserError("--nproc-per-node is required (how many ranks to start on this node)");
  if (o.command.empty()) {
    throw UserError("no subcommand to launch; usage: megatron launch --nproc-per-node N <subcommand> [args...]");
  }
  if (o.command.front() == "launch") throw UserError("`megatron launch` cannot launch `launch` itself");
  if (standalone) {
    if (o.nnodes != 1) throw UserError("--standalone runs a single node; it cannot be combined with --nnodes " +
                                       std::to_string(o.nnodes));
    o.master_port = 0;
  }
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    throw UserError("--node-rank " + std::to_string(o.node_rank) + " is not in [0, --nnodes " +
                    std::to_string(o.nnodes) + ")");
  }
  // Without it every node would believe it is node 0 and the job would hang in rendezvous.
  if (o.nnodes > 1 && !node_rank_given) {
    throw UserError("--nnodes " + std::to_string(o.nnodes) + " needs --node-rank (this node's index, 0.." +
                    std::to_string(o.nnodes - 1) + ")");
  }
  // Other nodes cannot learn a port chosen here.
  if (o.nnodes > 1 && o.master_port == 0) {
    throw UserError("--master-port 0 (pick a free port) only works on a single node; give every node the same port");
  }
  if (static_cast<long long>(o.nnodes) * o.nproc_per_node > INT_MAX) {
    throw UserError("--nnodes x --nproc-per-node is too large");
  }
  // A frozen rank must be named before its peers' collectives time out and blame themselves.
  if (!heartbeat_given) {
    if (const auto minutes = distributed_timeout_minutes(o.command)) {
      o.heartbeat_timeout_s = std::min(o.heartbeat_timeout_s, std::max(3.0, *minutes * 60 / 2));
    }
  }
  return o;
}

std::string launch_help() {
  return R"(usage: megatron launch --nproc-per-node N [flags] <subcommand> [args...]

Starts N ranks of `megatron <subcommand> [args...]` on this node, like torchrun. Each rank gets
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK, GROUP_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT in its environment; its output lines are prefixed "[rank R] ".
If a rank fails, the others are stopped and the launcher exits 1 naming that rank.

flags:
  --nproc-per-node N     ranks on this node (required)
  --nnodes M             nodes in the job (default 1); run one launcher per node
  --node-rank R          this node's index in [0, M) (required when M > 1)
  --master-addr A        address of node 0, where rank 0 listens (default 127.0.0.1)
  --master-port P        rank 0's rendezvous port (default 29500; 0 picks a free port, single node)
  --standalone           single node on a free port (same as --nnodes 1 --master-port 0)
  --log-dir D            also write each rank's output to D/rank_<R>.log
  --kill-timeout S       seconds between SIGTERM and SIGKILL when stopping ranks (default 5)
  --heartbeat-timeout S  a rank silent this long is stopped or frozen: it is named, killed, and the
                         others stopped (default 60, at most half the command's
                         --distributed-timeout-minutes; 0: not watched)
  --no-prefix-rank0      print rank 0's lines without the "[rank 0] " prefix
  --no-python            accepted for torchrun compatibility; has no effect
  --                     end of launch flags (optional)

OMP_NUM_THREADS, when unset and N > 1, is set to (CPU cores / N) for each rank.
)";
}

}  // namespace megatron::dist
