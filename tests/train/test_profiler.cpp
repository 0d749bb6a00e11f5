// --profile records the requested iterations with the PyTorch (Kineto) profiler: a Chrome
// trace with events lands in --tensorboard-dir and the log says where the time went.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/files.h"
#include "support/test_support.h"

namespace megatron {
namespace {

// A tiny CPU run profiled over [start, end).
test::CommandResult profiled_run(const std::string& dir, const std::string& start, const std::string& end) {
  return test::run_megatron({"train", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                             "--seq-length", "32", "--micro-batch-size", "2", "--train-iters", "4", "--lr", "1e-3",
                             "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "200", "--device", "cpu",
                             "--cpu-threads", "1", "--log-interval", "1", "--tensorboard-dir", dir, "--profile",
                             "--profile-step-start", start, "--profile-step-end", end});
}

TEST(Profiler, WritesATraceAndSaysWhereTheTimeWent) {
  test::TempDir dir;
  auto run = profiled_run(dir / "tb", "1", "3");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("> profile of iterations 1-2 on rank 0"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("aten::"), std::string::npos) << run.output;  // operators in the table
  const std::string trace = dir / "tb/trace_rank0_iterations_1-2.json";
  ASSERT_TRUE(std::filesystem::exists(trace)) << run.output;
  const nlohmann::json events = nlohmann::json::parse(read_file(trace)).at("traceEvents");
  EXPECT_GT(events.size(), 100u);
}

TEST(Profiler, EmptyWindowIsAnError) {
  test::TempDir dir;
  auto run = profiled_run(dir / "tb", "3", "3");
  EXPECT_EQ(run.status, 2) << run.output;
  EXPECT_NE(run.output.find("--profile-step-end (3) must be after --profile-step-start (3)"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace megatron
