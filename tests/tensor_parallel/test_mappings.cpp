// The tensor-parallel collectives and vocab-parallel cross entropy, on two ranks run as threads
// of this process over a real Gloo group: each forward and backward equals the unsplit
// computation on the full tensors.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>

#include "distributed/world.h"
#include "support/gloo_ranks.h"
#include "tensor_parallel/cross_entropy.h"
#include "tensor_parallel/layers.h"
#include "tensor_parallel/mappings.h"

namespace megatron {
namespace {

TEST(TensorParallelMappings, SequenceGatherAndReduceScatterAreConjugate) {
  const at::Tensor full = at::randn({8, 3, 5}, at::kDouble);                       // [s, b, h]
  std::vector<at::Tensor> upstream = {at::randn({8, 3, 5}, at::kDouble), at::randn({8, 3, 5}, at::kDouble)};
  std::vector<at::Tensor> partial = {at::randn({8, 3, 5}, at::kDouble), at::randn({8, 3, 5}, at::kDouble)};
  std::vector<at::Tensor> shard_grads = {at::randn({4, 3, 5}, at::kDouble), at::randn({4, 3, 5}, at::kDouble)};
  test::on_gloo_ranks(2, [&](int rank, const dist::Group& g) {
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
  test::on_gloo_ranks(2, [&](int rank, const dist::Group& g) {
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
  test::on_gloo_ranks(2, [&](int rank, const dist::Group& g) {
    tp::TensorParallel tp{g, false};
    at::Tensor e = tp::vocab_parallel_embedding(table.chunk(2, 0)[rank], tokens, tp);
    EXPECT_TRUE(at::equal(e, at::embedding(table, tokens)));
  });
}

}  // namespace
}  // namespace megatron

namespace megatron {
namespace {

// All-to-all with unequal splits (as expert-parallel dispatch sends each rank a different
// number of tokens), and its backward returning every row's gradient to the rank it came from.
TEST(TensorParallelMappings, AllToAllExchangesRowsBothWays) {
  // Rank r sends splits[r][q] rows to rank q; row values name their sender and position.
  const std::vector<std::vector<int64_t>> splits = {{1, 3}, {2, 0}};
  test::on_gloo_ranks(2, [&](int rank, const dist::Group& g) {
    const std::vector<int64_t>& in_splits = splits[size_t(rank)];
    const std::vector<int64_t> out_splits = {splits[0][size_t(rank)], splits[1][size_t(rank)]};
    const int64_t rows = in_splits[0] + in_splits[1];
    at::Tensor x = (at::arange(rows, at::kDouble) + 100 * rank).unsqueeze(1).repeat({1, 3}).requires_grad_();  // [rows, 3]
    at::Tensor y = tp::all_to_all(x, g, out_splits, in_splits);
    // What each sender put in this rank's block, in sender order.
    std::vector<at::Tensor> expected;
    for (int sender = 0; sender < 2; ++sender) {
      const auto& s = splits[size_t(sender)];
      const int64_t first = rank == 0 ? 0 : s[0];
      expected.push_back((at::arange(first, first + s[size_t(rank)], at::kDouble) + 100 * sender).unsqueeze(1).repeat({1, 3}));
    }
    ASSERT_TRUE(at::equal(y.detach(), at::cat(expected, 0))) << y;
    // d(sum(y * w)) / dx: each row of x gets the weight of the place it landed.
    const at::Tensor w = at::arange(y.size(0), at::kDouble).unsqueeze(1).repeat({1, 3}) + 10 * rank;
    (y * w).sum().backward();
    // Weights are place + 10 * receiver on every rank, so where each row landed is known here.
    std::vector<at::Tensor> landed;
    for (int receiver = 0; receiver < 2; ++receiver) {
      int64_t start = 0;  // rows from earlier senders in the receiver's output
      for (int sender = 0; sender < rank; ++sender) start += splits[size_t(sender)][size_t(receiver)];
      const int64_t n = in_splits[size_t(receiver)];
      landed.push_back((at::arange(start, start + n, at::kDouble) + 10 * receiver).unsqueeze(1).repeat({1, 3}));
    }
    EXPECT_TRUE(at::equal(x.grad(), at::cat(landed, 0))) << x.grad();
    // Equal blocks without splits.
    at::Tensor equal_in = at::full({4, 2}, double(rank));
    at::Tensor equal_out = tp::all_to_all(equal_in, g);
    EXPECT_TRUE(at::equal(equal_out, at::cat({at::zeros({2, 2}, at::kDouble), at::ones({2, 2}, at::kDouble)}, 0)));
  });
}

}  // namespace
}  // namespace megatron
