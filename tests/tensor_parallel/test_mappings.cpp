// The tensor-parallel collectives and vocab-parallel cross entropy, on two ranks run as threads
// of this process over a real Gloo group: each forward and backward equals the unsplit
// computation on the full tensors.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>
#include <thread>

#include "dist/world.h"
#include "support/free_port.h"
#include "tensor_parallel/cross_entropy.h"
#include "tensor_parallel/layers.h"
#include "tensor_parallel/mappings.h"

namespace megatron {
namespace {

// Runs body(rank, group) on `world` threads joined in one Gloo group; failures inside a thread
// are recorded by gtest as usual.
void on_ranks(int world, const std::function<void(int, const dist::Group&)>& body) {
  const int port = test::free_port();
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      dist::LaunchEnv env;
      env.rank = rank;
      env.world_size = world;
      env.master_port = port;
      dist::World w = dist::World::connect(env, "gloo", std::chrono::seconds(30));
      body(rank, w.everyone());
    });
  }
  for (auto& t : threads) t.join();
}

TEST(TensorParallelMappings, SequenceGatherAndReduceScatterAreConjugate) {
  const at::Tensor full = at::randn({8, 3, 5}, at::kDouble);                       // [s, b, h]
  std::vector<at::Tensor> upstream = {at::randn({8, 3, 5}, at::kDouble), at::randn({8, 3, 5}, at::kDouble)};
  std::vector<at::Tensor> partial = {at::randn({8, 3, 5}, at::kDouble), at::randn({8, 3, 5}, at::kDouble)};
  std::vector<at::Tensor> shard_grads = {at::randn({4, 3, 5}, at::kDouble), at::randn({4, 3, 5}, at::kDouble)};
  on_ranks(2, [&](int rank, const dist::Group& g) {
    // gather_from_sp: forward concatenates shards; backward sums every rank's gradient and keeps this rank's rows.
    at::Tensor shard = full.chunk(2, 0)[rank].clone().requires_grad_();
    at::Tensor gathered = tp::gather_from_sp(shard, g);
    EXPECT_TRUE(at::equal(gathered, full));
    gathered.backward(upstream[rank]);
    EXPECT_TRUE(at::allclose(shard.grad(), (upstream[0] + upstream[1]).chunk(2, 0)[rank]));

    // reduce_scatter_to_sp: forward sums partials and keeps this rank's rows; backward gathers.
    at::Tensor x = partial[rank].clone().requires_grad_();
    at::Tensor reduced = tp::reduce_scatter_to_sp(x, g);
    EXPECT_TRUE(at::allclose(reduced, (partial[0] + partial[1]).chunk(2, 0)[rank]));
    reduced.backward(shard_grads[rank]);
    EXPECT_TRUE(at::equal(x.grad(), at::cat({shard_grads[0], shard_grads[1]}, 0)));

    // copy_to_tp / reduce_from_tp: identity one way, all-reduce the other.
    at::Tensor y = partial[rank].clone().requires_grad_();
    tp::copy_to_tp(y, g).backward(upstream[rank]);
    EXPECT_TRUE(at::allclose(y.grad(), upstream[0] + upstream[1]));
    at::Tensor z = partial[rank].clone().requires_grad_();
    at::Tensor summed = tp::reduce_from_tp(z, g);
    EXPECT_TRUE(at::allclose(summed, partial[0] + partial[1]));
    summed.backward(upstream[rank]);
    EXPECT_TRUE(at::equal(z.grad(), upstream[rank]));

    // gather_from_tp / scatter_to_tp along the last dim.
    const at::Tensor columns = full.narrow(-1, 0, 4).contiguous();  // [8, 3, 4]
    at::Tensor part = columns.chunk(2, -1)[rank].clone().requires_grad_();
    at::Tensor whole = tp::gather_from_tp(part, g);
    EXPECT_TRUE(at::equal(whole, columns));
    whole.backward(upstream[rank].narrow(-1, 0, 4));
    EXPECT_TRUE(at::equal(part.grad(), upstream[rank].narrow(-1, 0, 4).chunk(2, -1)[rank]));
    at::Tensor w = columns.clone().requires_grad_();
    at::Tensor mine = tp::scatter_to_tp(w, g);
    EXPECT_TRUE(at::equal(mine, columns.chunk(2, -1)[rank]));
    mine.backward(shard_grads[rank].narrow(-1, 0, 2).narrow(0, 0, 4).repeat({2, 1, 1}));
  });
}

TEST(TensorParallelMappings, VocabParallelCrossEntropyEqualsFullSoftmax) {
  const int64_t s = 6, b = 2, v = 10;
  const at::Tensor logits = at::randn({s, b, v}, at::kDouble) * 3;
  const at::Tensor targets = at::randint(0, v, {s, b}, at::kLong);
  const at::Tensor upstream = at::rand({s, b}, at::kDouble);
  at::Tensor full = logits.clone().requires_grad_();
  at::Tensor expected = at::cross_entropy_loss(full.view({s * b, v}), targets.view({s * b}), {}, at::Reduction::None)
                            .view({s, b});
  expected.backward(upstream);
  on_ranks(2, [&](int rank, const dist::Group& g) {
    at::Tensor local = logits.chunk(2, -1)[rank].clone().requires_grad_();  // ids [5 * rank, 5 * rank + 5)
    at::Tensor loss = tp::vocab_parallel_cross_entropy(local.to(at::kFloat), targets, g);
    EXPECT_TRUE(at::allclose(loss.to(at::kDouble), expected.detach(), 1e-5, 1e-6)) << loss << expected;
    loss.backward(upstream.to(at::kFloat));
    EXPECT_TRUE(at::allclose(local.grad(), full.grad().chunk(2, -1)[rank], 1e-5, 1e-6));
  });
}

TEST(TensorParallelMappings, VocabParallelEmbeddingEqualsLookup) {
  const at::Tensor table = at::randn({10, 4}, at::kDouble);
  const at::Tensor tokens = at::randint(0, 10, {5, 3}, at::kLong);
  on_ranks(2, [&](int rank, const dist::Group& g) {
    tp::TensorParallel tp{g, false};
    at::Tensor e = tp::vocab_parallel_embedding(table.chunk(2, 0)[rank], tokens, tp);
    EXPECT_TRUE(at::equal(e, at::embedding(table, tokens)));
  });
}

}  // namespace
}  // namespace megatron
