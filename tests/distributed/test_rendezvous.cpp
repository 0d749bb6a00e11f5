// Rendezvous failures are clear errors, not hangs: a job whose peers never arrive stops after
// --distributed-timeout-minutes naming the address and how many ranks came, on rank 0 (which
// serves the store) and on a rank whose rank 0 never starts.
#include <gtest/gtest.h>

#include <chrono>

#include "support/free_port.h"
#include "support/test_support.h"

namespace megatron {
namespace {

std::string train_as(int rank, int world, int port) {
  return "RANK=" + std::to_string(rank) + " WORLD_SIZE=" + std::to_string(world) +
         " LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " " +
         test::shell_quote(test::megatron_binary()) +
         " train --num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 8 --micro-batch-size 1"
         " --train-iters 1 --lr 1e-3 --mock-data --vocab-size 64 --device cpu --distributed-timeout-minutes 0.05 2>&1";
}

TEST(Rendezvous, MissingPeerTimesOutOnRankZero) {
  const int port = test::free_port();
  const auto start = std::chrono::steady_clock::now();
  auto r = test::run_command(train_as(0, 2, port));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("error: rendezvous at 127.0.0.1:" + std::to_string(port) + " timed out after 3"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 of 2 ranks joined"), std::string::npos) << r.output;
  EXPECT_LT(seconds, 30.0);
}

TEST(Rendezvous, MissingRankZeroFailsTheOthers) {
  const int port = test::free_port();
  auto r = test::run_command(train_as(1, 2, port));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("error: rank 1: rendezvous at 127.0.0.1:" + std::to_string(port) + " failed"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--distributed-timeout-minutes"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron
