// The schedules against plain gradient accumulation: a pipeline of p x v tiny residual stages
// (y = x + tanh(x W)) run as p ranks on threads over Gloo, under 1F1B and interleaved 1F1B
// (including m = p, where the interleaved schedule is all warm-up), must give every stage's
// weight gradient and every micro-batch's loss of one process running the stages in order; each
// chunk is told exactly once, at its final backward, that it is the last micro-batch; and 1F1B
// keeps at most p - r micro-batches in flight on stage r.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <map>
#include <mutex>
#include <thread>

#include "distributed/launch_env.h"
#include "distributed/world.h"
#include "pipeline/schedules.h"
#include "support/free_port.h"

namespace megatron {
namespace {

constexpr int64_t kS = 3, kB = 2, kH = 4;

at::Tensor stage_forward(const at::Tensor& x, const at::Tensor& w) { return x + at::tanh(at::matmul(x, w)); }

struct Case {
  int p, v;
  int64_t m;
};

void check_schedule(const Case& c, bool forward_only) {
  SCOPED_TRACE("p=" + std::to_string(c.p) + " v=" + std::to_string(c.v) + " m=" + std::to_string(c.m) +
               (forward_only ? " forward only" : ""));
  const int stages = c.p * c.v;
  at::manual_seed(11);
  std::vector<at::Tensor> weights, inputs;
  for (int s = 0; s < stages; ++s) weights.push_back(at::randn({kH, kH}, at::kDouble) * 0.5);
  for (int64_t k = 0; k < c.m; ++k) inputs.push_back(at::randn({kS, kB, kH}, at::kDouble));

  // One process, stages in order, gradients accumulated over micro-batches.
  std::vector<at::Tensor> ref_w;
  for (const auto& w : weights) ref_w.push_back(w.clone().requires_grad_());
  std::vector<double> ref_losses;
  for (int64_t k = 0; k < c.m; ++k) {
    at::Tensor x = inputs[k];
    for (int s = 0; s < stages; ++s) x = stage_forward(x, ref_w[s]);
    at::Tensor loss = x.pow(2).sum() / double(c.m);
    ref_losses.push_back(loss.item<double>());
    loss.backward();
  }

  const test::ListeningPort port = test::listening_port();
  std::mutex mutex;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < c.p; ++rank) {
    threads.emplace_back([&, rank] {
      dist::LaunchEnv env;
      env.rank = rank;
      env.world_size = c.p;
      env.master_port = port.port;
      if (rank == 0) env.master_listen_fd = port.fd;
      dist::World world = dist::World::connect(env, "gloo", std::chrono::seconds(60));
      const dist::Group pp = world.everyone();
      std::vector<at::Tensor> w;  // chunk v holds virtual stage v * p + rank
      for (int chunk = 0; chunk < c.v; ++chunk) w.push_back(weights[chunk * c.p + rank].clone().requires_grad_());
      std::map<int64_t, double> losses;
      std::vector<int> last_flags(c.v, 0), backwards(c.v, 0);
      std::vector<int> backward_of_last(c.v, -1);
      pipeline::StageFunctions f;
      f.forward = [&](int chunk, int64_t k, const at::Tensor& input) -> at::Tensor {
        const int stage = chunk * c.p + rank;
        at::Tensor y = stage_forward(stage == 0 ? inputs[k] : input, w[chunk]);
        if (stage != stages - 1) return y;
        at::Tensor loss = y.pow(2).sum() / double(c.m);
        losses[k] = loss.item<double>();
        return loss;
      };
      f.before_backward = [&](int chunk, bool last) {
        if (last) {
          ++last_flags[chunk];
          backward_of_last[chunk] = backwards[chunk];
        }
        ++backwards[chunk];
      };
      pipeline::ScheduleOptions o;
      o.micro_batches = c.m;
      o.chunks = c.v;
      o.forward_only = forward_only;
      o.activation_shape = {kS, kB, kH};
      o.activation_options = at::TensorOptions().dtype(at::kDouble);
      const pipeline::ScheduleStats stats = pipeline::forward_backward(f, o, pp);

      std::lock_guard<std::mutex> lock(mutex);
      if (rank == c.p - 1) {
        ASSERT_EQ(losses.size(), size_t(c.m));
        for (int64_t k = 0; k < c.m; ++k) EXPECT_NEAR(losses[k], ref_losses[k], 1e-12) << "micro-batch " << k;
      }
      for (int chunk = 0; chunk < c.v; ++chunk) {
        const int stage = chunk * c.p + rank;
        if (forward_only) {
          EXPECT_FALSE(w[chunk].grad().defined());
          EXPECT_EQ(backwards[chunk], 0);
          continue;
        }
        ASSERT_TRUE(w[chunk].grad().defined()) << "stage " << stage;
        EXPECT_TRUE(at::allclose(w[chunk].grad(), ref_w[stage].grad(), 1e-10, 1e-12)) << "stage " << stage;
        EXPECT_EQ(backwards[chunk], c.m) << "stage " << stage;
        EXPECT_EQ(last_flags[chunk], 1) << "stage " << stage;
        EXPECT_EQ(backward_of_last[chunk], c.m - 1) << "stage " << stage;
      }
      if (!forward_only && c.v == 1) EXPECT_EQ(stats.max_in_flight, std::min<int64_t>(c.m, c.p - rank)) << "rank " << rank;
    });
  }
  for (auto& t : threads) t.join();
}

TEST(PipelineSchedules, OneFOneBMatchesAccumulation) {
  for (const Case& c : {Case{2, 1, 1}, Case{2, 1, 5}, Case{4, 1, 3}, Case{4, 1, 8}, Case{3, 1, 4}}) check_schedule(c, false);
}

TEST(PipelineSchedules, InterleavedMatchesAccumulation) {
  for (const Case& c : {Case{2, 2, 2}, Case{2, 2, 4}, Case{2, 3, 6}, Case{4, 2, 8}, Case{4, 2, 4}, Case{3, 2, 6}}) {
    check_schedule(c, false);
  }
}

TEST(PipelineSchedules, ForwardOnly) {
  for (const Case& c : {Case{2, 1, 3}, Case{4, 1, 2}, Case{2, 2, 4}}) check_schedule(c, true);
}

TEST(PipelineSchedules, NoPipelining) { check_schedule(Case{1, 1, 3}, false); }

}  // namespace
}  // namespace megatron
