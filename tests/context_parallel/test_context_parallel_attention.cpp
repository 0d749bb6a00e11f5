// Context-parallel core attention on 2 and 4 ranks run as threads of this process over a real
// Gloo group: for each --cp-comm-type (p2p ring, all_gather, a2a), each rank's output and the
// gradients of its q, k and v rows equal the rows of one SDPA over the whole sequence, causal
// and under packed documents' mask, with grouped-query heads; and the block arithmetic the ring
// is made of (partial attention merged by log-sum-exp, backward from the merged statistics).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>

#include "context_parallel/chunks.h"
#include "context_parallel/partial_attention.h"
#include "distributed/world.h"
#include "model/context_parallel_attention.h"
#include "model/core_attention.h"
#include "support/gloo_ranks.h"

namespace megatron {
namespace {

// Documents of 5, 11, 3 and the rest of the sequence: [b, 1, S, S], causal inside each.
at::Tensor packed_documents_mask(int64_t b, int64_t seq) {
  at::Tensor doc = at::zeros({seq}, at::kLong);
  int64_t start = 0, id = 0;
  for (int64_t len : {5, 11, 3}) {
    doc.narrow(0, start, len).fill_(id++);
    start += len;
  }
  doc.narrow(0, start, seq - start).fill_(id);
  const at::Tensor same = doc.unsqueeze(1) == doc.unsqueeze(0);
  const at::Tensor causal = at::ones({seq, seq}, at::kBool).tril();
  return same.logical_and(causal).view({1, 1, seq, seq}).expand({b, 1, seq, seq}).contiguous();
}

struct Case {
  int ranks;
  std::string comm_type;
  bool documents;
  int64_t value_dim;  // != head dim: multi-latent attention's shape
};

void check_against_whole_sequence(const Case& c) {
  const int64_t seq = 32, b = 2, heads = 4, groups = 2, d = 8;
  at::manual_seed(11);
  const at::Tensor q = at::randn({seq, b, heads, d}), k = at::randn({seq, b, groups, d}), v = at::randn({seq, b, groups, c.value_dim});
  const at::Tensor upstream = at::randn({seq, b, heads * c.value_dim});
  const at::Tensor mask = c.documents ? packed_documents_mask(b, seq) : at::Tensor();

  // The reference: one SDPA over the whole sequence.
  tp::TensorParallel alone;
  const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
  const at::Tensor want = SdpaAttention(alone).forward(rq, rk, rv, mask, 0.0);
  want.backward(upstream);

  test::on_gloo_ranks(c.ranks, [&](int rank, const dist::Group& g) {
    tp::TensorParallel tp;
    tp.context = g;
    const ContextParallelAttention attention(tp, c.comm_type);
    auto mine = [&](const at::Tensor& x) { return cp::rank_rows(x, 0, c.ranks, rank); };
    const at::Tensor lq = mine(q).requires_grad_(), lk = mine(k).requires_grad_(), lv = mine(v).requires_grad_();
    const at::Tensor got = attention.forward(lq, lk, lv, mask, 0.0);
    got.backward(mine(upstream));
    const std::string what = c.comm_type + " on " + std::to_string(c.ranks) + " ranks" + (c.documents ? ", documents" : "") +
                             ", rank " + std::to_string(rank);
    EXPECT_TRUE(at::allclose(got, mine(want), 1e-5, 1e-5)) << what << ": output";
    EXPECT_TRUE(at::allclose(lq.grad(), mine(rq.grad()), 1e-4, 1e-5)) << what << ": dq";
    EXPECT_TRUE(at::allclose(lk.grad(), mine(rk.grad()), 1e-4, 1e-5)) << what << ": dk";
    EXPECT_TRUE(at::allclose(lv.grad(), mine(rv.grad()), 1e-4, 1e-5)) << what << ": dv";
  });
}

TEST(ContextParallelAttention, RingEqualsOneAttentionOverTheSequence) {
  for (int ranks : {2, 4}) {
    for (bool documents : {false, true}) check_against_whole_sequence({ranks, "p2p", documents, 8});
  }
  check_against_whole_sequence({2, "p2p", false, 6});  // value head dim of its own (MLA)
}

TEST(ContextParallelAttention, AllGatherEqualsOneAttentionOverTheSequence) {
  for (int ranks : {2, 4}) {
    for (bool documents : {false, true}) check_against_whole_sequence({ranks, "all_gather", documents, 8});
  }
}

// On 4 ranks the 2 key/value groups are copied per query head before the heads are traded.
TEST(ContextParallelAttention, UlyssesEqualsOneAttentionOverTheSequence) {
  for (int ranks : {2, 4}) {
    for (bool documents : {false, true}) check_against_whole_sequence({ranks, "a2a", documents, 8});
  }
}

TEST(ContextParallelChunks, RanksHoldAnEarlyAndALateChunk) {
  EXPECT_TRUE(at::equal(cp::rank_positions(16, 2, 0, at::TensorOptions()), at::tensor({0, 1, 2, 3, 12, 13, 14, 15}, at::kLong)));
  EXPECT_TRUE(at::equal(cp::rank_positions(16, 2, 1, at::TensorOptions()), at::tensor({4, 5, 6, 7, 8, 9, 10, 11}, at::kLong)));
  const at::Tensor x = at::arange(24).view({2, 12});
  std::vector<at::Tensor> held;
  for (int r = 0; r < 3; ++r) held.push_back(cp::rank_rows(x, 1, 3, r));
  EXPECT_TRUE(at::equal(held[2], x.narrow(1, 4, 4)));  // chunks 2 and 3 of 6: adjacent for the middle rank
  EXPECT_TRUE(at::equal(held[0], at::cat({x.narrow(1, 0, 2), x.narrow(1, 10, 2)}, 1)));
  EXPECT_TRUE(at::equal(cp::rows_in_sequence_order(at::cat(held, 1), 1, 3), x));
}

// The ring's arithmetic without the ring: keys cut into blocks, each block's attention merged by
// log-sum-exp, equals attention over all keys; each block's backward from the merged output and
// statistics sums to the whole gradient.
TEST(ContextParallelAttention, BlocksMergedByLogSumExpEqualTheWholeAttention) {
  at::manual_seed(5);
  const int64_t b = 2, heads = 4, groups = 2, sq = 6, sk = 12, d = 8;
  const at::Tensor q = at::randn({b, heads, sq, d}), k = at::randn({b, groups, sk, d}), v = at::randn({b, groups, sk, d});
  at::Tensor mask = at::rand({b, 1, sq, sk}) > 0.3;
  mask.select(3, 0).fill_(true);           // every query sees a key
  mask.narrow(3, 4, 4).select(2, 1).fill_(false);  // query 1 sees nothing in the second block
  const double scale = 0.3;
  cp::PartialAttention merged = cp::empty_partial(b, heads, sq, d, q.options());
  for (int64_t first : {0, 4, 8}) {
    cp::merge_into(merged, cp::attend_block(q, k.narrow(2, first, 4), v.narrow(2, first, 4), false, mask.narrow(3, first, 4), scale), 0);
  }
  const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
  const at::Tensor want = at::scaled_dot_product_attention(rq, rk, rv, mask, 0.0, false, scale, /*enable_gqa=*/true);
  EXPECT_TRUE(at::allclose(merged.out, want, 1e-5, 1e-6));
  const at::Tensor upstream = at::randn_like(want);
  want.backward(upstream);
  at::Tensor dq = at::zeros_like(q);
  std::vector<at::Tensor> dk, dv;
  for (int64_t first : {0, 4, 8}) {
    const cp::BlockGrads g = cp::attend_block_backward(upstream, q, k.narrow(2, first, 4), v.narrow(2, first, 4), merged.out,
                                                       merged.lse, false, mask.narrow(3, first, 4), scale);
    dq += g.dq;
    dk.push_back(g.dk);
    dv.push_back(g.dv);
  }
  EXPECT_TRUE(at::allclose(dq, rq.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(at::cat(dk, 2), rk.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(at::cat(dv, 2), rv.grad(), 1e-4, 1e-5));
}

// The fused kernels hand back their block's output in bf16: the merge reads it as it is (no fp32
// copy) and gives what it gives for the same values in fp32; the accumulator a first block starts
// is an fp32 contiguous copy whatever the block's dtype and layout.
TEST(ContextParallelAttention, MergeReadsBlocksInTheirOwnDtype) {
  at::manual_seed(9);
  const int64_t b = 1, heads = 2, rows = 5, d = 4;
  const cp::PartialAttention first{at::randn({b, rows, heads, d}).to(at::kBFloat16).transpose(1, 2), at::randn({b, heads, rows})};
  const cp::PartialAttention later{at::randn({b, heads, 3, d}).to(at::kBFloat16), at::randn({b, heads, 3})};
  cp::PartialAttention acc = cp::accumulator_from({first.out, first.lse.clone()});  // its fp32 lse becomes acc's
  EXPECT_EQ(acc.out.scalar_type(), at::kFloat);
  EXPECT_TRUE(acc.out.is_contiguous());
  EXPECT_TRUE(at::equal(acc.out, first.out.to(at::kFloat)));
  cp::PartialAttention want = cp::empty_partial(b, heads, rows, d, at::TensorOptions());
  cp::merge_into(want, {first.out.to(at::kFloat), first.lse}, 0);
  EXPECT_TRUE(at::allclose(acc.out, want.out, 0.0, 0.0));
  EXPECT_TRUE(at::allclose(acc.lse, want.lse, 0.0, 0.0));
  cp::merge_into(acc, later, 2);
  cp::merge_into(want, {later.out.to(at::kFloat), later.lse}, 2);
  EXPECT_TRUE(at::equal(acc.out, want.out));
  EXPECT_TRUE(at::equal(acc.lse, want.lse));
  // The merge itself, by hand for the rows the later block adds to.
  const at::Tensor merged = at::logaddexp(first.lse.narrow(2, 2, 3), later.lse);
  const at::Tensor by_hand = first.out.narrow(2, 2, 3).to(at::kFloat) * at::exp(first.lse.narrow(2, 2, 3) - merged).unsqueeze(-1) +
                             later.out.to(at::kFloat) * at::exp(later.lse - merged).unsqueeze(-1);
  EXPECT_LT((acc.out.narrow(2, 2, 3) - by_hand).abs().max().item<double>(), 1e-5);
}

}  // namespace
}  // namespace megatron
