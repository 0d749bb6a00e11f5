// `megatron launch` with real processes (the hidden `megatron _print-env` as the ranks):
// environment per rank, output prefixes, failure propagation, signal forwarding, flag errors.
// Wall-clock bounds here are generous sanity limits ("stops within seconds, not after the
// ranks' 60 s sleep"), not performance assertions.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "distributed/heartbeat.h"
#include "distributed/launcher.h"
#include "support/free_port.h"
#include "support/test_support.h"

namespace megatron::test {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<std::string> launch_args(std::vector<std::string> launch_flags, const std::vector<std::string>& rank_args) {
  std::vector<std::string> args = {"launch"};
  args.insert(args.end(), launch_flags.begin(), launch_flags.end());
  args.push_back("_print-env");
  args.insert(args.end(), rank_args.begin(), rank_args.end());
  return args;
}

std::string env_line(int rank, int world, int local_rank, int local_world, const std::string& addr, int port) {
  return "env rank=" + std::to_string(rank) + " world_size=" + std::to_string(world) +
         " local_rank=" + std::to_string(local_rank) + " local_world_size=" + std::to_string(local_world) +
         " master_addr=" + addr + " master_port=" + std::to_string(port) + " source=torchrun";
}

// The pids the ranks printed ("... pid=123"), to check afterwards that none survived.
// (The failure report repeats lines, hence a set.)
std::set<pid_t> printed_pids(const std::string& output, const std::string& key = " pid=") {
  std::set<pid_t> pids;
  for (size_t at = output.find(key); at != std::string::npos; at = output.find(key, at + 1)) {
    pids.insert(static_cast<pid_t>(std::stol(output.substr(at + key.size()))));
  }
  return pids;
}

// Gone, or a zombie waiting for a reaper that is not us: either way it runs no more.
bool process_gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

bool eventually_gone(pid_t pid) {
  const auto start = Clock::now();
  while (!process_gone(pid)) {
    if (seconds_since(start) > 10) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The launcher in the background with its output in a file, so the test can signal it.
class BackgroundLaunch {
 public:
  BackgroundLaunch(const std::vector<std::string>& args, const std::string& output_path) : output_(output_path) {
    std::vector<std::string> argv_storage = {megatron_binary()};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      FILE* out = std::fopen(output_.c_str(), "w");
      if (out == nullptr) ::_exit(126);
      ::dup2(::fileno(out), 1);
      ::dup2(::fileno(out), 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~BackgroundLaunch() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  std::string output() const { return read_file(output_); }

  bool wait_for_output(const std::string& what, size_t times, double timeout_s) const {
    const auto start = Clock::now();
    while (count(output(), what) < times) {
      if (seconds_since(start) > timeout_s) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return true;
  }

  // The exit status as run_command reports it (128 + signal when killed), or -1 on timeout.
  int wait(double timeout_s) {
    const auto start = Clock::now();
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (seconds_since(start) > timeout_s) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  std::string output_;
  pid_t pid_ = -1;
};

TEST(Launcher, EveryRankGetsItsEnvironmentAndPrefix) {
  const auto r = run_megatron(launch_args({"--nproc-per-node", "3"}, {"--stderr-message", "hello from stderr"}));
  ASSERT_EQ(r.status, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string prefix = "[rank " + std::to_string(rank) + "] ";
    EXPECT_NE(r.output.find(prefix + env_line(rank, 3, rank, 3, "127.0.0.1", 29500)), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(prefix + "hello from stderr\n"), std::string::npos) << r.output;
  }
  EXPECT_EQ(count(r.output, "env rank="), 3u) << r.output;
}

TEST(Launcher, SecondNodeRanksFollowTheNodeRank) {
  // Only the environment is checked, so no other node has to exist.
  const auto r = run_megatron(launch_args({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1",
                                           "--master-addr", "10.1.2.3", "--master-port", "12345"},
                                          {}));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 2] " + env_line(2, 4, 0, 2, "10.1.2.3", 12345)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 3] " + env_line(3, 4, 1, 2, "10.1.2.3", 12345)), std::string::npos) << r.output;
}

// The port is picked and held listening by the launcher before any rank starts, and rank 0's
// store serves on that very socket: no other process can take the port in between (picking a
// port and letting rank 0 bind it later lost it now and then to parallel test runs).
TEST(Launcher, PortZeroPicksOneFreePortSharedByAllRanks) {
  const auto r = run_megatron(launch_args({"--nproc-per-node=2", "--master_port=0"}, {"--probe-master-port"}));
  ASSERT_EQ(r.status, 0) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex("master_port=(\\d+)"))) << r.output;
  const int port = std::stoi(m[1]);
  EXPECT_GT(port, 0);
  EXPECT_NE(port, 29500);
  EXPECT_EQ(count(r.output, "master_port=" + std::to_string(port) + " "), 2u) << r.output;
  // Rank 0 alone holds the socket, already listening when it starts.
  EXPECT_EQ(count(r.output, "master_listen_fd="), 1u) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\\] env rank=0 [^\\n]* master_listen_fd=\\d+"))) << r.output;
  EXPECT_NE(r.output.find("rank 0: master port " + std::to_string(port) + " is taken"), std::string::npos) << r.output;
}

TEST(Launcher, LogDirAndUnprefixedRankZero) {
  TempDir dir;
  const auto r = run_megatron(launch_args({"--nproc-per-node", "2", "--log-dir", dir / "logs", "--no-prefix-rank0"},
                                          {"--lines", "2"}));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("[rank 0]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\nline 2 of rank 0\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] line 2 of rank 1\n"), std::string::npos) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = read_file(dir / ("logs/rank_" + std::to_string(rank) + ".log"));
    EXPECT_NE(log.find(env_line(rank, 2, rank, 2, "127.0.0.1", 29500)), std::string::npos) << log;
    EXPECT_NE(log.find("line 2 of rank " + std::to_string(rank) + "\n"), std::string::npos) << log;
    EXPECT_EQ(log.find("[rank"), std::string::npos) << log;
  }
}

TEST(Launcher, FailingRankStopsTheJobAndIsNamed) {
  const auto start = Clock::now();
  const auto r = run_megatron(launch_args(
      {"--nproc-per-node", "3"},
      {"--fail-rank", "1", "--exit-code", "3", "--lines", "30", "--sleep-rank", "0,2", "--seconds", "60"}));
  EXPECT_LT(seconds_since(start), 20.0) << "the sleeping ranks were not stopped\n" << r.output;
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("launch: rank 1 (local rank 1, pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(") exited with status 3\n"), std::string::npos) << r.output;
  // The report repeats the failed rank's last ten lines, and only those.
  const size_t report = r.output.find("launch: last 10 lines of rank 1:\n");
  ASSERT_NE(report, std::string::npos) << r.output;
  const std::string tail = r.output.substr(report);
  EXPECT_NE(tail.find("  line 22 of rank 1\n"), std::string::npos) << tail;
  EXPECT_NE(tail.find("  line 30 of rank 1\n"), std::string::npos) << tail;
  EXPECT_NE(tail.find("  rank 1: failing on purpose with exit code 3\n"), std::string::npos) << tail;
  EXPECT_EQ(tail.find("line 21 of rank 1"), std::string::npos) << tail;
  for (pid_t pid : printed_pids(r.output)) EXPECT_TRUE(process_gone(pid)) << "pid " << pid << "\n" << r.output;
}

// The cause is the rank whose error came first, not the first to exit: rank 0 reports its own
// failure and is still writing (sleeping) when rank 1, whose error follows from it (a peer's
// "connection closed"), exits at once. The order is fixed by a file, not by the clock.
TEST(Launcher, TheCauseIsTheEarliestErrorNotTheFirstExit) {
  TempDir dir;
  const auto r = run_megatron(launch_args(
      {"--nproc-per-node", "2"}, {"--exit-code", "2", "--touch-after-error", dir / "first-error-printed", "--error-at", "0=0",
                                  "--exit-at", "0=60", "--error-after-file", "1=" + (dir / "first-error-printed"),
                                  "--exit-at", "1=0"}));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("launch: rank 1 exited with status 2; stopping the other ranks"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launch: rank 0 (local rank 0, pid "), std::string::npos) << r.output;
  const size_t report = r.output.find("launch: last ");
  ASSERT_NE(report, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lines of rank 0:\n", report), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  error: rank 0's own failure\n", report), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launch: the other ranks: 1: exited with status 2"), std::string::npos) << r.output;
}

// A rank stopped (SIGSTOP: no thread of it runs) stops beating: the launcher names it and
// kills it after --heartbeat-timeout, while its peer, which would wait for it in a collective
// until its own timeout, is stopped as for any failure.
TEST(Launcher, AFrozenRankIsNamedAndKilled) {
  const auto start = Clock::now();
  const auto r = run_megatron(launch_args({"--nproc-per-node", "2", "--heartbeat-timeout", "3"},
                                          {"--fail-rank", "1", "--fail-signal", std::to_string(SIGSTOP),
                                           "--sleep-rank", "0", "--seconds", "60"}));
  EXPECT_LT(seconds_since(start), 40.0) << "the frozen rank was not noticed\n" << r.output;
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("launch: rank 1 sent no heartbeat for 3 s (stopped or frozen); killing it"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(") sent no heartbeat for 3 s (stopped or frozen) and was killed\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launch: rank 1 (local rank 1, pid "), std::string::npos) << r.output;
  for (pid_t pid : printed_pids(r.output)) EXPECT_TRUE(process_gone(pid)) << "pid " << pid << "\n" << r.output;
}

// The first beat is on the socket when the rank's start-up returns, not left to the thread: a
// rank that froze at once would otherwise never be watched, and its launch would hang on it (seen
// on a loaded CI machine: the SIGSTOP came before the thread's first beat).
TEST(Launcher, TheFirstHeartbeatIsSentBeforeStartUpReturns) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  ASSERT_EQ(::setenv(dist::kHeartbeatFdVariable, std::to_string(pair[1]).c_str(), 1), 0);
  dist::start_heartbeat_from_environment();
  EXPECT_EQ(std::getenv(dist::kHeartbeatFdVariable), nullptr) << "the variable is not for this rank's children";
  char beat = 0;
  EXPECT_EQ(::recv(pair[0], &beat, 1, MSG_DONTWAIT), 1) << "no beat yet when start-up returned";
  ::close(pair[0]);  // the beating thread's next send fails and it ends
}

// A rank busy for longer than the heartbeat timeout (its main thread asleep: a long step, a
// collective waiting on a peer) keeps beating and is left alone.
TEST(Launcher, ABusyRankKeepsBeating) {
  const auto r = run_megatron(launch_args({"--nproc-per-node", "2", "--heartbeat-timeout", "3"},
                                          {"--sleep-rank", "all", "--seconds", "5"}));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("heartbeat"), std::string::npos) << r.output;
}

// Unless given, the heartbeat timeout is at most half the command's collective timeout, so a
// frozen rank is named before its peers time out and blame themselves.
TEST(Launcher, TheHeartbeatTimeoutFollowsTheDistributedTimeout) {
  const auto timeout = [](std::vector<std::string> args) { return dist::parse_launch_arguments(args).heartbeat_timeout_s; };
  EXPECT_EQ(timeout({"--nproc-per-node", "2", "train", "--lr", "1"}), 60.0);
  EXPECT_EQ(timeout({"--nproc-per-node", "2", "train", "--distributed-timeout-minutes", "1"}), 30.0);
  EXPECT_EQ(timeout({"--nproc-per-node", "2", "train", "--distributed-timeout-minutes=0.01"}), 3.0);
  EXPECT_EQ(timeout({"--nproc-per-node", "2", "train", "--distributed-timeout-minutes", "30"}), 60.0);
  EXPECT_EQ(timeout({"--nproc-per-node", "2", "--heartbeat-timeout", "10", "train", "--distributed-timeout-minutes", "0.1"}), 10.0);
  EXPECT_EQ(timeout({"--nproc-per-node", "2", "--heartbeat-timeout", "0", "train"}), 0.0);
  // Set in the recipe only, in either spelling; the command line wins over it, as in train.
  TempDir dir;
  std::ofstream(dir / "dashed.yaml") << "lr: 0.1\ndistributed-timeout-minutes: 1\n";
  std::ofstream(dir / "underscored.yaml") << "distributed_timeout_minutes: 0.2\n";
  EXPECT_EQ(timeout({"--nproc-per-node", "2", "train", "--config", dir / "dashed.yaml"}), 30.0);
  EXPECT_EQ(timeout({"--nproc-per-node", "2", "train", "--config=" + std::string(dir / "underscored.yaml")}), 6.0);
  EXPECT_EQ(timeout({"--nproc-per-node", "2", "train", "--distributed-timeout-minutes", "0.1", "--config", dir / "dashed.yaml"}), 3.0);
  EXPECT_EQ(timeout({"--nproc-per-node", "2", "train", "--config", dir / "missing.yaml"}), 60.0) << "the rank reports the bad path";
}

TEST(Launcher, RankKilledByASignalIsReportedWithTheSignal) {
  const auto r = run_megatron(launch_args({"--nproc-per-node", "2"},
                                          {"--fail-rank", "0", "--fail-signal", std::to_string(SIGABRT),
                                           "--sleep-rank", "1", "--seconds", "60"}));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("launch: rank 0 (local rank 0, pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by SIGABRT"), std::string::npos) << r.output;
}

TEST(Launcher, StoppingARankAlsoStopsItsDescendants) {
  // Each rank forks a sleeping grandchild it never waits for; the launcher signals whole
  // process groups, so those go too.
  TempDir dir;
  BackgroundLaunch launch(
      launch_args({"--nproc-per-node", "2"}, {"--spawn-grandchild", "--sleep-rank", "all", "--seconds", "60"}),
      dir / "out.txt");
  ASSERT_TRUE(launch.wait_for_output("grandchild pid=", 2, 30)) << launch.output();
  const auto grandchildren = printed_pids(launch.output(), "grandchild pid=");
  ASSERT_EQ(grandchildren.size(), 2u) << launch.output();
  ASSERT_EQ(::kill(launch.pid(), SIGTERM), 0);
  EXPECT_EQ(launch.wait(20), 128 + SIGTERM) << launch.output();
  for (pid_t pid : grandchildren) EXPECT_TRUE(eventually_gone(pid)) << "grandchild " << pid << " survived";
}

TEST(Launcher, SigtermIsForwardedToTheRanks) {
  TempDir dir;
  BackgroundLaunch launch(launch_args({"--nproc-per-node", "2"}, {"--sleep-rank", "all", "--seconds", "60"}),
                          dir / "out.txt");
  ASSERT_TRUE(launch.wait_for_output("env rank=", 2, 30)) << launch.output();
  const auto ranks = printed_pids(launch.output());
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_EQ(::kill(launch.pid(), SIGTERM), 0);
  EXPECT_EQ(launch.wait(20), 128 + SIGTERM) << launch.output();
  EXPECT_NE(launch.output().find("launch: received SIGTERM; forwarding it to all ranks"), std::string::npos);
  for (pid_t pid : ranks) EXPECT_TRUE(eventually_gone(pid)) << "rank pid " << pid << " survived";
}

TEST(Launcher, RanksIgnoringSigtermAreKilledAfterTheTimeout) {
  TempDir dir;
  BackgroundLaunch launch(launch_args({"--nproc-per-node", "2", "--kill-timeout", "1"},
                                      {"--sleep-rank", "all", "--seconds", "60", "--ignore-sigterm"}),
                          dir / "out.txt");
  ASSERT_TRUE(launch.wait_for_output("env rank=", 2, 30)) << launch.output();
  const auto ranks = printed_pids(launch.output());
  ASSERT_EQ(::kill(launch.pid(), SIGTERM), 0);
  EXPECT_EQ(launch.wait(20), 128 + SIGTERM) << launch.output();
  EXPECT_NE(launch.output().find("sending SIGKILL"), std::string::npos) << launch.output();
  for (pid_t pid : ranks) EXPECT_TRUE(eventually_gone(pid)) << "rank pid " << pid << " survived";
}

TEST(Launcher, BadFlagsAreNamedErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"launch", "_print-env"}, "--nproc-per-node is required"},
      {{"launch", "--nproc-per-node", "2"}, "no subcommand to launch"},
      {{"launch", "--nproc-per-node", "0", "_print-env"}, "--nproc-per-node must be at least 1"},
      {{"launch", "--nproc-per-node", "two", "_print-env"}, "--nproc-per-node expects an integer"},
      {{"launch", "--nproc-per-node"}, "--nproc-per-node expects a value"},
      {{"launch", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2", "_print-env"},
       "--node-rank 2 is not in [0, --nnodes 2)"},
      {{"launch", "--nproc-per-node", "2", "--nnodes", "2", "_print-env"}, "needs --node-rank"},
      {{"launch", "--nproc-per-node", "2", "--master-port", "65536", "_print-env"}, "--master-port 65536 is not a TCP port"},
      {{"launch", "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "0", "--master-port", "0", "_print-env"},
       "--master-port 0"},
      {{"launch", "--nproc-per-node", "2", "--nnodes", "1:4", "_print-env"}, "elastic"},
      {{"launch", "--nproc-per-node", "2", "--frobnicate", "_print-env"}, "unknown flag --frobnicate"},
      {{"launch", "--nproc-per-node", "2", "--kill-timeout", "-1", "_print-env"}, "--kill-timeout expects"},
      {{"launch", "--nproc-per-node", "2", "--heartbeat-timeout", "1", "_print-env"}, "--heartbeat-timeout 1: ranks beat once a second"},
      {{"launch", "--nproc-per-node", "2", "--heartbeat-timeout", "nan", "_print-env"}, "--heartbeat-timeout expects"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = run_megatron(args);
    EXPECT_EQ(r.status, 2) << args.back() << "\n" << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << "expected '" << message << "' in:\n" << r.output;
  }
}

TEST(Launcher, HelpDescribesFlagsAndPrintEnvStaysHidden) {
  const auto help = run_megatron({"launch", "--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_NE(help.output.find("--nproc-per-node"), std::string::npos) << help.output;
  const auto top = run_megatron({"--help"});
  EXPECT_NE(top.output.find("launch"), std::string::npos) << top.output;
  EXPECT_EQ(top.output.find("_print-env"), std::string::npos) << top.output;
}

TEST(Launcher, BusyMasterPortFailsAtOnceNamingIt) {
  // Something already listens on the port rank 0's store would take.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  const auto start = Clock::now();
  const auto r = run_megatron(launch_args({"--nproc-per-node", "2", "--master-port", std::to_string(port)}, {}));
  ::close(fd);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--master-port " + std::to_string(port) + " is already in use on this node"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--master-port 0 (or --standalone) to pick a free one"), std::string::npos) << r.output;
  EXPECT_LT(seconds_since(start), 30.0) << "not after the rendezvous timeout";
}

// torchrun itself (the venv's) starting `megatron train` as its program: the ranks join the
// store torchrun's agent already serves (TORCHELASTIC_USE_AGENT_STORE) instead of failing to
// bind one, and take the OMP_NUM_THREADS it gives each rank.
TEST(Torchrun, RanksJoinTheAgentsStoreAndTakeItsThreadCount) {
  const std::string python = venv_python();
  ASSERT_FALSE(python.empty());
  const std::string torchrun = python.substr(0, python.rfind('/')) + "/torchrun";
  const std::string command = shell_quote(torchrun) + " --nproc-per-node 2 --master-port " + std::to_string(free_port()) +
                              " --no-python " + shell_quote(megatron_binary()) + " train --config " +
                              shell_quote(source_dir() + "/examples/tiny_cpu.yaml") +
                              " --mock-data --device cpu --train-iters 2 --lr-warmup-iters 0 --eval-interval 0 --log-interval 1";
  const auto r = run_command(command);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find(" iteration        2/       2 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 CPU threads"), std::string::npos) << "torchrun sets OMP_NUM_THREADS=1 per rank\n" << r.output;
  for (const char* failure : {"EADDRINUSE", "address already in use", "bind"}) {
    EXPECT_EQ(r.output.find(failure), std::string::npos) << failure << " in\n" << r.output;
  }
}

// A megatron program writing to a pipe whose reader has gone gets EPIPE, not SIGPIPE: Gloo writes
// to its peers' sockets the same way, and a rank sending when a peer was killed died of the
// signal instead of reporting the failed collective (report_errors.cpp).
TEST(Launch, ProgramsOutliveAClosedPipe) {
  const auto r = test::run_command("bash -c '" + test::megatron_binary() +
                                   " _print-env --lines 200000 | head -1 > /dev/null; echo status=${PIPESTATUS[0]}'");
  EXPECT_NE(r.output.find("status=0"), std::string::npos) << r.output << "(141: killed by SIGPIPE)";
}

}  // namespace
}  // namespace megatron::test
