// LaunchEnv parsing: torchrun / `megatron launch` variables, Slurm's (task counts, node lists),
// precedence, and the inconsistent values that must be user errors naming the variable. The
// environment is set in-process and restored after each test.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <optional>

#include "core/errors.h"
#include "distributed/launch_env.h"
#include "distributed/launcher.h"

namespace megatron::dist {
namespace {

// Clears every variable the parser reads, and restores them all on destruction, so tests
// neither see the machine's (a CI job under Slurm) nor leak their own.
class ScopedLaunchEnvironment {
 public:
  ScopedLaunchEnvironment() {
    for (const char* name : kNames) {
      const char* value = std::getenv(name);
      saved_[name] = value ? std::optional<std::string>(value) : std::nullopt;
      ::unsetenv(name);
    }
  }
  ~ScopedLaunchEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value) ::setenv(name.c_str(), value->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }
  void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }

 private:
  static constexpr const char* kNames[] = {
      "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
      "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
      "SLURM_NODEID", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
      "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID", kMasterListenFdVariable};
  std::map<std::string, std::optional<std::string>> saved_;
};

// Runs `f`, expecting a UserError whose message contains every one of `parts`.
template <typename F>
void expect_user_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no UserError; expected one mentioning " << parts.front();
  } catch (const UserError& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(LaunchEnv, NothingSetMeansOneProcess) {
  ScopedLaunchEnvironment env;
  const LaunchEnv e = launch_env_from_environment();
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world_size, 1);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.source, "single");
}

TEST(LaunchEnv, Torchrun) {
  ScopedLaunchEnvironment env;
  env.set("RANK", "5");
  env.set("WORLD_SIZE", "8");
  env.set("LOCAL_RANK", "1");
  env.set("LOCAL_WORLD_SIZE", "4");
  env.set("MASTER_ADDR", "node-a");
  env.set("MASTER_PORT", "1234");
  const LaunchEnv e = launch_env_from_environment();
  EXPECT_EQ(describe(e), "rank=5 world_size=8 local_rank=1 local_world_size=4 master_addr=node-a master_port=1234 "
                         "source=torchrun");
}

// A TCP socket bound to a free port, listening (as the launcher hands rank 0) or only bound;
// closed at scope end.
struct TestSocket {
  int fd = -1;
  int port = 0;
  explicit TestSocket(bool listening) {
    if (listening) {
      fd = listen_on_free_port(port);
      return;
    }
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port = ntohs(addr.sin_port);
  }
  ~TestSocket() { ::close(fd); }
};

// `megatron launch --master-port 0` hands rank 0 its listening socket; only rank 0 takes it, and
// only a socket listening on MASTER_PORT passes.
TEST(LaunchEnv, RankZeroTakesTheLaunchersListeningSocket) {
  TestSocket listener(true), bound_only(false);
  {
    ScopedLaunchEnvironment env;
    env.set("RANK", "0");
    env.set("WORLD_SIZE", "2");
    env.set("MASTER_PORT", std::to_string(listener.port));
    env.set(kMasterListenFdVariable, std::to_string(listener.fd));
    const LaunchEnv e = launch_env_from_environment();
    EXPECT_EQ(e.master_listen_fd, listener.fd);
    EXPECT_NE(describe(e).find(" master_listen_fd=" + std::to_string(listener.fd)), std::string::npos) << describe(e);
    env.set("RANK", "1");
    EXPECT_EQ(launch_env_from_environment().master_listen_fd, -1);
  }
  const std::vector<std::pair<std::map<std::string, std::string>, std::vector<std::string>>> cases = {
      // listening, but on another port than MASTER_PORT
      {{{"MASTER_PORT", std::to_string(listener.port == 65535 ? 1 : listener.port + 1)}, {kMasterListenFdVariable, std::to_string(listener.fd)}},
       {kMasterListenFdVariable, "MASTER_PORT=", "unset it"}},
      // bound, not listening
      {{{"MASTER_PORT", std::to_string(bound_only.port)}, {kMasterListenFdVariable, std::to_string(bound_only.fd)}},
       {std::string(kMasterListenFdVariable) + "=" + std::to_string(bound_only.fd)}},
      // not open at all, or not a number
      {{{"MASTER_PORT", "29500"}, {kMasterListenFdVariable, "1000"}}, {std::string(kMasterListenFdVariable) + "=1000"}},
      {{{"MASTER_PORT", "29500"}, {kMasterListenFdVariable, "x"}}, {std::string(kMasterListenFdVariable) + "='x'"}},
  };
  for (const auto& [vars, parts] : cases) {
    ScopedLaunchEnvironment env;
    env.set("RANK", "0");
    env.set("WORLD_SIZE", "2");
    for (const auto& [name, value] : vars) env.set(name.c_str(), value);
    expect_user_error([] { launch_env_from_environment(); }, parts);
  }
}

TEST(LaunchEnv, PlainEnvInitDefaultsToOneNode) {
  ScopedLaunchEnvironment env;
  env.set("RANK", "3");
  env.set("WORLD_SIZE", "4");
  const LaunchEnv e = launch_env_from_environment();
  EXPECT_EQ(e.local_rank, 3);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnv, TorchrunVariablesWinOverSlurm) {
  // `megatron launch` run inside an srun step: its ranks' RANK must count, not SLURM_PROCID.
  ScopedLaunchEnvironment env;
  env.set("SLURM_PROCID", "0");
  env.set("SLURM_NTASKS", "1");
  env.set("SLURM_LOCALID", "0");
  env.set("RANK", "2");
  env.set("WORLD_SIZE", "4");
  const LaunchEnv e = launch_env_from_environment();
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 2);
}

TEST(LaunchEnv, SlurmWithCompressedTasksPerNodeAndNodeList) {
  ScopedLaunchEnvironment env;
  env.set("SLURM_PROCID", "5");
  env.set("SLURM_NTASKS", "8");
  env.set("SLURM_LOCALID", "1");
  env.set("SLURM_NODEID", "1");
  env.set("SLURM_TASKS_PER_NODE", "4(x2)");
  env.set("SLURM_JOB_NODELIST", "gpu[07-08]");
  env.set("SLURM_JOB_ID", "123456");
  const LaunchEnv e = launch_env_from_environment();
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "gpu07");
  EXPECT_EQ(e.master_port, 20000 + 123456 % 20000);  // same on every task of the job
}

TEST(LaunchEnv, SlurmHeterogeneousNodesAndExplicitOverrides) {
  ScopedLaunchEnvironment env;
  env.set("SLURM_PROCID", "4");
  env.set("SLURM_NTASKS", "5");
  env.set("SLURM_LOCALID", "0");
  env.set("SLURM_NODEID", "2");
  env.set("SLURM_TASKS_PER_NODE", "2(x2),1");
  env.set("SLURM_NODELIST", "a1,b[2-3]");
  LaunchEnv e = launch_env_from_environment();
  EXPECT_EQ(e.local_world_size, 1);
  EXPECT_EQ(e.master_addr, "a1");
  EXPECT_EQ(e.master_port, 29500);

  env.set("SLURM_NTASKS_PER_NODE", "2");  // a plain count wins over the compressed list
  env.set("SLURM_LOCALID", "1");
  env.set("SLURM_STEP_NODELIST", "c[10-11]");  // the step's nodes, where rank 0 really runs
  e = launch_env_from_environment();
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "c10");

  env.set("MASTER_ADDR", "head");
  env.set("MASTER_PORT", "4000");
  e = launch_env_from_environment();
  EXPECT_EQ(e.master_addr, "head");
  EXPECT_EQ(e.master_port, 4000);
}

TEST(LaunchEnv, SlurmNodeListExpansion) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_nodelist("node[01-04,07]"), (V{"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(expand_slurm_nodelist("single"), (V{"single"}));
  EXPECT_EQ(expand_slurm_nodelist("a1,b[2-3],c"), (V{"a1", "b2", "b3", "c"}));
  EXPECT_EQ(expand_slurm_nodelist("n[8-11]"), (V{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand_slurm_nodelist("n[098-101]"), (V{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_slurm_nodelist("r[1-2]-g[1,3]-ib"), (V{"r1-g1-ib", "r1-g3-ib", "r2-g1-ib", "r2-g3-ib"}));
  for (const std::string bad : {"node[01-", "node[a-b]", "node[5-3]", "node[]", "", "a,,b", "x]"}) {
    expect_user_error([&] { expand_slurm_nodelist(bad, "SLURM_JOB_NODELIST"); }, {"SLURM_JOB_NODELIST"});
  }
  expect_user_error([] { expand_slurm_nodelist("n[0-99999999]"); }, {"too many hosts"});
}

TEST(LaunchEnv, SlurmTasksPerNodeFormats) {
  using V = std::vector<int>;
  EXPECT_EQ(parse_slurm_tasks_per_node("8"), (V{8}));
  EXPECT_EQ(parse_slurm_tasks_per_node("4(x2),3"), (V{4, 4, 3}));
  EXPECT_EQ(parse_slurm_tasks_per_node("1(x3)"), (V{1, 1, 1}));
  for (const std::string bad : {"", "x", "4(x)", "4(2)", "0", "4(x0)", "4,,2", "4(x2"}) {
    expect_user_error([&] { parse_slurm_tasks_per_node(bad, "SLURM_TASKS_PER_NODE"); }, {"SLURM_TASKS_PER_NODE"});
  }
}

TEST(LaunchEnv, InconsistentTorchrunValuesNameTheVariable) {
  const std::vector<std::pair<std::map<std::string, std::string>, std::vector<std::string>>> cases = {
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, {"RANK=2", "WORLD_SIZE=2"}},
      {{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, {"RANK=-1"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, {"WORLD_SIZE=0"}},
      {{{"RANK", "abc"}, {"WORLD_SIZE", "2"}}, {"RANK='abc'"}},
      {{{"RANK", "1"}}, {"WORLD_SIZE is not"}},
      {{{"WORLD_SIZE", "2"}}, {"RANK is not"}},
      {{{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}, {"LOCAL_RANK=2"}},
      {{{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "8"}}, {"LOCAL_WORLD_SIZE=8"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "0"}}, {"MASTER_PORT=0"}},
      {{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "http"}}, {"MASTER_PORT='http'"}},
  };
  for (const auto& [vars, parts] : cases) {
    ScopedLaunchEnvironment env;
    for (const auto& [name, value] : vars) env.set(name.c_str(), value);
    expect_user_error([] { launch_env_from_environment(); }, parts);
  }
}

TEST(LaunchEnv, InconsistentSlurmValuesNameTheVariable) {
  const std::vector<std::pair<std::map<std::string, std::string>, std::vector<std::string>>> cases = {
      {{{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}}, {"SLURM_PROCID=4", "SLURM_NTASKS=4"}},
      {{{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}}, {"SLURM_NTASKS is not set"}},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}, {"SLURM_LOCALID is not set"}},
      {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "4"}, {"SLURM_TASKS_PER_NODE", "4(x2)"}},
       {"SLURM_LOCALID=4", "SLURM_TASKS_PER_NODE"}},
      {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"},
        {"SLURM_TASKS_PER_NODE", "4(x2)"}},
       {"SLURM_NODEID=2"}},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_NODELIST", "n[1-"}},
       {"SLURM_JOB_NODELIST"}},
  };
  for (const auto& [vars, parts] : cases) {
    ScopedLaunchEnvironment env;
    for (const auto& [name, value] : vars) env.set(name.c_str(), value);
    expect_user_error([] { launch_env_from_environment(); }, parts);
  }
}

}  // namespace
}  // namespace megatron::dist
