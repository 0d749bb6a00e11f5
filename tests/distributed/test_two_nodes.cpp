// `megatron launch --nnodes 2` across two network namespaces on this machine (ip netns and a veth
// pair: two hosts with their own addresses and a link between them), Gloo over the link: a
// two-node job trains exactly as one node with the same ranks, a node whose rank is killed stops
// the other node's job with the lost peer named, and both restart from the last checkpoint with
// the losses of a run never stopped. Needs root (CAP_NET_ADMIN) and `ip`; skipped, saying why,
// where network namespaces cannot be made.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "support/test_support.h"

namespace megatron::test {
namespace {

// Two namespaces joined by a veth pair, node 0 at 10.213.N.1 and node 1 at 10.213.N.2; removed
// on destruction (deleting a namespace removes its end of the pair, and so both).
class NamespacePair {
 public:
  NamespacePair() {
    const std::string id = std::to_string(::getpid());
    subnet_ = "10.213." + std::to_string(::getpid() % 250);
    for (int node = 0; node < 2; ++node) {
      ns_[node] = "mtron" + id + "n" + std::to_string(node);
      link_[node] = "mv" + id + "n" + std::to_string(node);  // at most 15 characters
    }
    const CommandResult made = run_command("ip netns add " + ns_[0] + " && ip netns add " + ns_[1]);
    if (made.status != 0) {
      why_not_ = "cannot create network namespaces here (needs root and `ip`): " + made.output;
      return;
    }
    std::string setup = "ip link add " + link_[0] + " type veth peer name " + link_[1];
    for (int node = 0; node < 2; ++node) {
      setup += " && ip link set " + link_[node] + " netns " + ns_[node] + " && ip -n " + ns_[node] + " addr add " +
               address(node) + "/24 dev " + link_[node] + " && ip -n " + ns_[node] + " link set " + link_[node] +
               " up && ip -n " + ns_[node] + " link set lo up";
    }
    const CommandResult linked = run_command(setup + " && " + on_node(1, "true"));
    if (linked.status != 0) why_not_ = "cannot link the namespaces with a veth pair: " + linked.output;
  }
  ~NamespacePair() { run_command("ip netns del " + ns_[0] + "; ip netns del " + ns_[1]); }

  const std::string& why_not() const { return why_not_; }
  std::string address(int node) const { return subnet_ + "." + std::to_string(node + 1); }
  // `command` run inside node's namespace, Gloo bound to its end of the link.
  std::string on_node(int node, const std::string& command) const {
    return "ip netns exec " + ns_[node] + " env GLOO_SOCKET_IFNAME=" + link_[node] + " " + command;
  }
  // Kills node's rank RANK (the process whose environment says so) with SIGKILL.
  std::string kill_rank(int node, int rank) const {
    return "for p in $(ip netns pids " + ns_[node] + "); do tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | grep -qx RANK=" +
           std::to_string(rank) + " && kill -KILL $p; done";
  }

 private:
  std::string ns_[2], link_[2], subnet_, why_not_;
};

std::string command_line(const std::vector<std::string>& args) {
  std::string line = shell_quote(megatron_binary());
  for (const auto& a : args) line += " " + shell_quote(a);
  return line;
}

// The tiny recipe over 2 ranks (data parallel), its learning-rate schedule fixed apart from
// --train-iters so that a run stopped anywhere can resume to any length.
std::vector<std::string> train(const std::vector<std::string>& extra) {
  std::vector<std::string> args = tiny_cpu_train({"--lr-decay-iters", "100000", "--log-interval", "1", "--global-batch-size", "8",
                                                  "--micro-batch-size", "2", "--distributed-timeout-minutes", "1"});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::vector<std::string> launch(int node, const NamespacePair& pair, int port, const std::vector<std::string>& train_args) {
  std::vector<std::string> args = {"launch", "--nnodes", "2", "--node-rank", std::to_string(node), "--nproc-per-node", "1",
                                   "--master-addr", pair.address(0), "--master-port", std::to_string(port)};
  args.insert(args.end(), train_args.begin(), train_args.end());
  return args;
}

struct TwoNodeRun {
  int status[2] = {-1, -1};
  std::string output[2];
};

// Both nodes' launchers at once; `meanwhile` runs beside them (e.g. kills a rank) and they are
// waited for.
TwoNodeRun run_two_nodes(const NamespacePair& pair, const TempDir& dir, const std::vector<std::string>& train_args,
                         const std::string& meanwhile = "true") {
  static int port = 29700 + ::getpid() % 200;
  ++port;
  const std::string log0 = dir / "node0.log", log1 = dir / "node1.log";
  const CommandResult r = run_command(
      pair.on_node(0, command_line(launch(0, pair, port, train_args))) + " > " + shell_quote(log0) + " 2>&1 & a=$!; " +
      pair.on_node(1, command_line(launch(1, pair, port, train_args))) + " > " + shell_quote(log1) + " 2>&1 & b=$!; " +
      "(" + meanwhile + "); wait $a; echo status0=$?; wait $b; echo status1=$?");
  TwoNodeRun run;
  for (int node = 0; node < 2; ++node) {
    const std::string key = "status" + std::to_string(node) + "=";
    const size_t at = r.output.find(key);
    if (at != std::string::npos) run.status[node] = std::stoi(r.output.substr(at + key.size()));
    std::ifstream in(node == 0 ? log0 : log1);
    std::stringstream text;
    text << in.rdbuf();
    run.output[node] = text.str();
  }
  return run;
}

TEST(TwoNodes, TrainsAsOneNodeStopsTogetherAndRestarts) {
  NamespacePair pair;
  if (!pair.why_not().empty()) GTEST_SKIP() << pair.why_not();
  TempDir dir;

  // 1. Equal losses: two nodes of one rank each against one node of two ranks.
  const auto one_node = run_megatron([] {
    std::vector<std::string> args = {"launch", "--nproc-per-node", "2", "--master-port", "0"};
    for (const auto& a : train({"--train-iters", "6"})) args.push_back(a);
    return args;
  }());
  ASSERT_EQ(one_node.status, 0) << one_node.output;
  const TwoNodeRun both = run_two_nodes(pair, dir, train({"--train-iters", "6"}));
  ASSERT_EQ(both.status[0], 0) << both.output[0] << both.output[1];
  ASSERT_EQ(both.status[1], 0) << both.output[1];
  const auto reference = logged_losses(one_node.output);
  ASSERT_EQ(reference.size(), 6u) << one_node.output;
  EXPECT_EQ(logged_losses(both.output[1]), reference) << both.output[1];  // the last rank logs

  // 2. Node 1's rank killed once a checkpoint exists: node 1's launcher reports it, node 0's rank
  //    loses its peer and node 0's launcher stops with the peer's node named.
  const std::string ckpt = dir / "ckpt", tracker = ckpt + "/latest_checkpointed_iteration.txt";
  const TwoNodeRun killed = run_two_nodes(
      pair, dir, train({"--train-iters", "100000", "--save", ckpt, "--save-interval", "2"}),
      "for i in $(seq 1200); do [ -e " + shell_quote(tracker) + " ] && break; sleep 0.05; done; " + pair.kill_rank(1, 1));
  EXPECT_EQ(killed.status[1], 1) << killed.output[1];
  EXPECT_NE(killed.output[1].find("launch: rank 1 (local rank 0, pid "), std::string::npos) << killed.output[1];
  EXPECT_NE(killed.output[1].find("was killed by SIGKILL"), std::string::npos) << killed.output[1];
  EXPECT_EQ(killed.status[0], 1) << killed.output[0];
  EXPECT_NE(killed.output[0].find("launch: rank 0 (local rank 0, pid "), std::string::npos) << killed.output[0];
  EXPECT_NE(killed.output[0].find("error: communication with another rank failed"), std::string::npos) << killed.output[0];
  EXPECT_NE(killed.output[0].find("[" + pair.address(1) + "]:"), std::string::npos) << "node 1 not named:\n" << killed.output[0];

  // 3. Both restart from the last checkpoint; the next steps' losses are those of a run never stopped.
  std::ifstream in(tracker);
  int saved = 0;
  ASSERT_TRUE(in >> saved) << tracker;
  const int end = saved + 3;
  const TwoNodeRun resumed = run_two_nodes(pair, dir, train({"--train-iters", std::to_string(end), "--load", ckpt}));
  ASSERT_EQ(resumed.status[0], 0) << resumed.output[0] << resumed.output[1];
  EXPECT_NE(resumed.output[0].find("loaded checkpoint"), std::string::npos) << resumed.output[0];
  const auto straight = run_megatron([&] {
    std::vector<std::string> args = {"launch", "--nproc-per-node", "2", "--master-port", "0"};
    for (const auto& a : train({"--train-iters", std::to_string(end)})) args.push_back(a);
    return args;
  }());
  ASSERT_EQ(straight.status, 0) << straight.output;
  const auto all = logged_losses(straight.output);
  ASSERT_EQ(all.size(), size_t(end)) << straight.output;
  EXPECT_EQ(logged_losses(resumed.output[1]), std::vector<double>(all.end() - 3, all.end())) << resumed.output[1];
}

}  // namespace
}  // namespace megatron::test
