// Reads a process's place in a distributed job from torchrun-style or Slurm variables.
#include "distributed/launch_env.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>

#include "core/errors.h"

namespace megatron::dist {
namespace {

// Slurm allocations of a million hosts do not exist; a range that large is a typo, and expanding
// it would only exhaust memory.
constexpr size_t kMaxHosts = 1000000;

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

// Strict: the whole value must be a decimal integer, so "4(x2)" or "" in RANK is an error
// rather than a silently truncated number.
int parse_int(const std::string& value, const std::string& variable) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || end != value.c_str() + value.size() || errno == ERANGE || v < INT_MIN || v > INT_MAX) {
    throw UserError(variable + "='" + value + "' is not an integer");
  }
  return static_cast<int>(v);
}

std::optional<int> env_int(const char* name) {
  auto value = env(name);
  if (!value) return std::nullopt;
  return parse_int(*value, name);
}

int require_int(const char* name, const char* because) {
  auto value = env_int(name);
  if (!value) throw UserError(std::string(name) + " is not set, but " + because + " is");
  return *value;
}

// The socket `megatron launch` handed rank 0 must be listening on MASTER_PORT: anything else (a
// variable copied into another job's environment) would have the store serve where no rank looks.
int master_listen_fd(const LaunchEnv& e) {
  const int fd = *env_int(kMasterListenFdVariable);
  int listening = 0;
  socklen_t size = sizeof(listening);
  sockaddr_storage addr{};
  socklen_t addr_size = sizeof(addr);
  const bool is_listener = ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) == 0 && listening != 0 &&
                           ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &addr_size) == 0;
  int port = -1;
  if (is_listener && addr.ss_family == AF_INET) port = ntohs(reinterpret_cast<sockaddr_in&>(addr).sin_port);
  if (is_listener && addr.ss_family == AF_INET6) port = ntohs(reinterpret_cast<sockaddr_in6&>(addr).sin6_port);
  if (port != e.master_port) {
    throw UserError(std::string(kMasterListenFdVariable) + "=" + std::to_string(fd) + " is not a socket listening on MASTER_PORT=" +
                    std::to_string(e.master_port) + " (only `megatron launch --master-port 0` sets it; unset it)");
  }
  return fd;
}

int parse_port(const std::string& value, const std::string& variable) {
  const int port = parse_int(value, variable);
  if (port < 1 || port > 65535) throw UserError(variable + "=" + value + " is not a TCP port (1..65535)");
  return port;
}

// Rejects the combinations no launcher produces; naming both variables tells the user which
// script line to fix.
void check_consistent(const LaunchEnv& e, const std::string& rank_var, const std::string& world_var,
                      const std::string& local_rank_var, const std::string& local_world_var) {
  if (e.world_size < 1) throw UserError(world_var + "=" + std::to_string(e.world_size) + " must be at least 1");
  if (e.rank < 0 || e.rank >= e.world_size) {
    throw UserError(rank_var + "=" + std::to_string(e.rank) + " is not in [0, " + world_var + "=" +
                    std::to_string(e.world_size) + ")");
  }
  if (e.local_world_size < 1 || e.local_world_size > e.world_size) {
    throw UserError(local_world_var + "=" + std::to_string(e.local_world_size) + " is not in [1, " + world_var +
                    "=" + std::to_string(e.world_size) + "]");
  }
  if (e.local_rank < 0 || e.local_rank >= e.local_world_size) {
    throw UserError(local_rank_var + "=" + std::to_string(e.local_rank) + " is not in [0, " + local_world_var +
                    "=" + std::to_string(e.local_world_size) + ")");
  }
}

LaunchEnv from_torchrun() {
  LaunchEnv e;
  e.source = "torchrun";
  if (!env("RANK")) throw UserError("WORLD_SIZE is set but RANK is not; set both (or neither for one process)");
  if (!env("WORLD_SIZE")) throw UserError("RANK is set but WORLD_SIZE is not; set both (or neither for one process)");
  e.rank = *env_int("RANK");
  e.world_size = *env_int("WORLD_SIZE");
  // Plain env:// launches (RANK/WORLD_SIZE only) are single-node in practice; torchrun and
  // `megatron launch` always set the local pair.
  e.local_world_size = env_int("LOCAL_WORLD_SIZE").value_or(e.world_size);
  e.local_rank = env_int("LOCAL_RANK").value_or(e.local_world_size > 0 ? e.rank % e.local_world_size : 0);
  check_consistent(e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  if (auto addr = env("MASTER_ADDR")) {
    if (addr->empty()) throw UserError("MASTER_ADDR is set but empty");
    e.master_addr = *addr;
  }
  if (auto port = env("MASTER_PORT")) e.master_port = parse_port(*port, "MASTER_PORT");
  if (auto agent = env("TORCHELASTIC_USE_AGENT_STORE")) e.agent_store = *agent == "True";
  e.restart_count = env_int("TORCHELASTIC_RESTART_COUNT").value_or(0);
  if (e.rank == 0 && env(kMasterListenFdVariable)) e.master_listen_fd = master_listen_fd(e);
  return e;
}

LaunchEnv from_slurm() {
  LaunchEnv e;
  e.source = "slurm";
  e.rank = *env_int("SLURM_PROCID");
  // srun's step variables describe the ranks actually started; the job-wide ones (inherited
  // from sbatch) may describe a larger allocation.
  const char* world_var = env("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS"
                          : env("SLURM_NTASKS")       ? "SLURM_NTASKS"
                          : env("SLURM_NPROCS")       ? "SLURM_NPROCS"
                                                      : "SLURM_NTASKS";
  e.world_size = require_int(world_var, "SLURM_PROCID");
  e.local_rank = require_int("SLURM_LOCALID", "SLURM_PROCID");

  std::string local_world_var = "SLURM_STEP_TASKS_PER_NODE";
  if (env("SLURM_STEP_TASKS_PER_NODE") || env("SLURM_NTASKS_PER_NODE") || env("SLURM_TASKS_PER_NODE")) {
    if (!env(local_world_var.c_str())) {
      local_world_var = env("SLURM_NTASKS_PER_NODE") ? "SLURM_NTASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
    }
    const std::vector<int> counts = parse_slurm_tasks_per_node(*env(local_world_var.c_str()), local_world_var);
    // A heterogeneous list ("4(x2),3") has one entry per node, in node-id order; a single
    // plain count (SLURM_NTASKS_PER_NODE=4) holds for every node.
    const int node = counts.size() == 1 ? 0 : env_int("SLURM_NODEID").value_or(0);
    if (node < 0 || node >= static_cast<int>(counts.size())) {
      throw UserError("SLURM_NODEID=" + std::to_string(node) + " has no entry in " + local_world_var + "=" +
                      *env(local_world_var.c_str()));
    }
    e.local_world_size = counts[node];
  } else {
    local_world_var = "SLURM_NTASKS";
    e.local_world_size = e.world_size;
  }
  check_consistent(e, "SLURM_PROCID", world_var, "SLURM_LOCALID", local_world_var);

  if (auto addr = env("MASTER_ADDR"); addr && !addr->empty()) {
    e.master_addr = *addr;
  } else {
    // Rank 0 runs on the step's first node.
    for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (auto list = env(var); list && !list->empty()) {
        e.master_addr = expand_slurm_nodelist(*list, var).front();
        break;
      }
    }
  }
  if (auto port = env("MASTER_PORT")) {
    e.master_port = parse_port(*port, "MASTER_PORT");
  } else if (auto job = env("SLURM_JOB_ID")) {
    // Every task of a job derives the same port, and two jobs sharing a node rarely collide,
    // which a fixed 29500 would.
    e.master_port = 20000 + static_cast<int>(std::strtoul(job->c_str(), nullptr, 10) % 20000);
  }
  return e;
}

// Appends the expansions of one host pattern ("rack[1-2]-n[01,03]") to `out`.
void expand_host(const std::string& host, const std::string& variable, std::vector<std::string>& out) {
  const auto bad = [&](const std::string& why) {
    return UserError(variable + "='" + host + "': " + why);
  };
  std::vector<std::string> partial = {""};
  size_t i = 0;
  while (i < host.size()) {
    if (host[i] == ']') throw bad("']' without '['");
    if (host[i] != '[') {
      const size_t next = host.find_first_of("[]", i);
      const std::string text = host.substr(i, next == std::string::npos ? std::string::npos : next - i);
      for (auto& p : partial) p += text;
      i += text.size();
      continue;
    }
    const size_t close = host.find(']', i);
    if (close == std::string::npos) throw bad("'[' without ']'");
    const std::string inside = host.substr(i + 1, close - i - 1);
    if (inside.empty()) throw bad("empty '[]'");
    std::vector<std::string> items;
    size_t start = 0;
    while (start <= inside.size()) {
      size_t comma = inside.find(',', start);
      if (comma == std::string::npos) comma = inside.size();
      const std::string item = inside.substr(start, comma - start);
      const size_t dash = item.find('-');
      const std::string lo = item.substr(0, dash);
      const std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
      const auto digits = [](const std::string& s) {
        return !s.empty() && s.size() < 10 && s.find_first_not_of("0123456789") == std::string::npos;
      };
      if (!digits(lo) || !digits(hi)) throw bad("'" + item + "' is not a number or a range a-b");
      const long a = std::stol(lo), b = std::stol(hi);
      if (b < a) throw bad("range '" + item + "' runs backwards");
      if (static_cast<size_t>(b - a + 1) * partial.size() > kMaxHosts) throw bad("expands to too many hosts");
      for (long v = a; v <= b; ++v) {
        std::string num = std::to_string(v);
        // Slurm pads to the width of the range's first bound: node[01-10] -> node01..node10.
        if (num.size() < lo.size()) num.insert(0, lo.size() - num.size(), '0');
        items.push_back(num);
      }
      start = comma + 1;
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * items.size());
    for (const auto& p : partial) {
      for (const auto& item : items) next.push_back(p + item);
    }
    partial.swap(next);
    i = close + 1;
  }
  if (out.size() + partial.size() > kMaxHosts) throw bad("expands to too many hosts");
  out.insert(out.end(), partial.begin(), partial.end());
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list, const std::string& variable) {
  std::vector<std::string> hosts;
  // Split on commas outside brackets: "a[1,3],b" is two patterns, not three.
  int depth = 0;
  std::string current;
  const auto flush = [&] {
    if (current.empty()) throw UserError(variable + "='" + list + "' has an empty host name");
    expand_host(current, variable, hosts);
    current.clear();
  };
  for (char c : list) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      flush();
    } else {
      current += c;
    }
  }
  flush();
  return hosts;
}

std::vector<int> parse_slurm_tasks_per_node(const std::string& value, const std::string& variable) {
  std::vector<int> counts;
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    if (comma == std::string::npos) comma = value.size();
    const std::string item = value.substr(start, comma - start);
    const size_t paren = item.find('(');
    int repeat = 1;
    if (paren != std::string::npos) {
      // "4(x2)": four tasks on each of two nodes.
      if (item.size() < paren + 4 || item.compare(paren, 2, "(x") != 0 || item.back() != ')') {
        throw UserError(variable + "='" + value + "': '" + item + "' is not N or N(xM)");
      }
      repeat = parse_int(item.substr(paren + 2, item.size() - paren - 3), variable);
    }
    const int count = parse_int(item.substr(0, paren), variable);
    if (count < 1 || repeat < 1 || counts.size() + repeat > kMaxHosts) {
      throw UserError(variable + "='" + value + "': '" + item + "' must count at least one task on one node");
    }
    counts.insert(counts.end(), repeat, count);
    start = comma + 1;
  }
  return counts;
}

LaunchEnv launch_env_from_environment() {
  if (env("RANK") || env("WORLD_SIZE")) return from_torchrun();
  if (env("SLURM_PROCID")) return from_slurm();
  return LaunchEnv{};
}

std::string describe(const LaunchEnv& e) {
  return "rank=" + std::to_string(e.rank) + " world_size=" + std::to_string(e.world_size) +
         " local_rank=" + std::to_string(e.local_rank) + " local_world_size=" + std::to_string(e.local_world_size) +
         " master_addr=" + e.master_addr + " master_port=" + std::to_string(e.master_port) + " source=" + e.source +
         (e.master_listen_fd >= 0 ? " master_listen_fd=" + std::to_string(e.master_listen_fd) : "");
}

}  // namespace megatron::dist
