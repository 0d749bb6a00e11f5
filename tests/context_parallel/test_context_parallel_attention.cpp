// Context-parallel core attention on 2 and 4 ranks run as threads of this process over a real
// Gloo group: for each --cp-comm-type (p2p ring, all_gather, a2a, a2a+p2p), each rank's output and the
// gradients of its q, k and v rows equal the rows of one SDPA over the whole sequence, causal
// and under packed documents' mask, with grouped-query heads; and the block arithmetic the ring
// is made of (partial attention merged by log-sum-exp, backward from the merged statistics).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>

#include "context_parallel/chunks.h"
#include "context_parallel/document_blocks.h"
#include "context_parallel/ring_attention.h"
#include "context_parallel/partial_attention.h"
#include "distributed/parallel_state.h"
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

// The same documents as their ids ([b, S] int32), the mask's compact form the batch carries.
at::Tensor packed_document_ids(int64_t b, int64_t seq) {
  at::Tensor ids = at::full({seq}, 3, at::kInt);
  ids.narrow(0, 0, 5).fill_(0);
  ids.narrow(0, 5, 11).fill_(1);
  ids.narrow(0, 16, 3).fill_(2);
  return ids.view({1, seq}).expand({b, seq}).contiguous();
}

struct Case {
  int ranks;
  std::string comm_type;
  bool documents;
  int64_t value_dim;  // != head dim: multi-latent attention's shape
  bool as_ids = true;  // the documents as ids (else as their dense mask) for the ranks
  int a2a = 1;         // a2a+p2p: the first level's size (ranks / a2a for the second)
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

  test::on_gloo_worlds(c.ranks, [&](int rank, dist::World& world) {
    tp::TensorParallel tp;
    tp.context = world.everyone();
    if (c.comm_type == "a2a+p2p") {
      // As ParallelState lays them out (the ranks here are one CP group).
      const std::vector<dist::LayoutDim> levels = dist::with_context_levels({{"cp", c.ranks}}, c.a2a, c.ranks / c.a2a);
      tp.context_a2a = dist::group_holding(world, rank, levels, {"cp_a2a"});
      tp.context_p2p = dist::group_holding(world, rank, levels, {"cp_p2p"});
    }
    const ContextParallelAttention attention(tp, c.comm_type);
    auto mine = [&](const at::Tensor& x) { return cp::rank_rows(x, 0, c.ranks, rank); };
    const at::Tensor lq = mine(q).requires_grad_(), lk = mine(k).requires_grad_(), lv = mine(v).requires_grad_();
    const at::Tensor got = attention.forward(lq, lk, lv, c.documents && c.as_ids ? packed_document_ids(b, seq) : mask, 0.0);
    got.backward(mine(upstream));
    const std::string what = c.comm_type + " on " + std::to_string(c.ranks) + " ranks" +
                             (c.comm_type == "a2a+p2p" ? " (" + std::to_string(c.a2a) + " x " + std::to_string(c.ranks / c.a2a) + ")" : "") +
                             (c.documents ? c.as_ids ? ", document ids" : ", documents' mask" : "") +
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
  for (bool documents : {false, true}) check_against_whole_sequence({2, "p2p", documents, 6});  // value head dim of its own (MLA)
  check_against_whole_sequence({2, "p2p", true, 8, /*as_ids=*/false});  // documents read off their dense mask
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
  check_against_whole_sequence({2, "a2a", true, 8, /*as_ids=*/false});
}

// Ulysses among 2 adjacent ranks, the ring over the pairs' chunk spans; 4 x 1 copies the key/value
// heads per query head (2 groups over 4 ranks), 1 x 4 is the ring alone.
TEST(ContextParallelAttention, HierarchicalEqualsOneAttentionOverTheSequence) {
  for (bool documents : {false, true}) check_against_whole_sequence({4, "a2a+p2p", documents, 8, true, /*a2a=*/2});
  check_against_whole_sequence({4, "a2a+p2p", true, 8, /*as_ids=*/false, 2});  // the documents' dense mask
  check_against_whole_sequence({4, "a2a+p2p", false, 6, true, 2});             // a value head dim of its own (MLA)
  check_against_whole_sequence({4, "a2a+p2p", false, 8, true, 4});
  check_against_whole_sequence({4, "a2a+p2p", true, 8, true, 1});
}

// The levels' rank groups with TP 2 x CP 4 (2 x 2) x DP 2: the a2a level pairs adjacent CP ranks
// (global ranks 2 apart, TP fastest), the ring joins the same place of each pair (4 apart); the
// CP groups themselves are unchanged.
TEST(ContextParallelLevels, AdjacentContextRanksTradeHeadsTheOthersFormTheRing) {
  const std::vector<dist::LayoutDim> order = {{"tp", 2}, {"cp", 4}, {"ep", 1}, {"dp", 2}, {"pp", 1}};
  const std::vector<dist::LayoutDim> levels = dist::with_context_levels(order, 2, 2);
  using Groups = std::vector<std::vector<int>>;
  auto sorted = [](Groups g) {
    std::sort(g.begin(), g.end());
    return g;
  };
  EXPECT_EQ(sorted(dist::layout_groups(levels, {"cp_a2a"})),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(sorted(dist::layout_groups(levels, {"cp_p2p"})),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(sorted(dist::layout_groups(levels, {"cp_a2a", "cp_p2p"})), sorted(dist::layout_groups(order, {"cp"})));
  EXPECT_EQ(sorted(dist::layout_groups(levels, {"dp"})), sorted(dist::layout_groups(order, {"dp"})));
  EXPECT_THROW(dist::with_context_levels(order, 3, 2), c10::Error);
}

// Steps of one kind run as one block: on 8 ranks, rank 3 holds three earlier ranks' early chunks
// (all its queries over each) and four later ranks' both chunks (its late chunk over each); rank 0
// only later ranks'. Groups never mix kinds and never pass steps_per_block.
TEST(ContextParallelAttention, RingGroupsJoinConsecutiveStepsOfOneKind) {
  EXPECT_EQ(cp::ring_steps_per_block(/*c=*/2048, /*cp=*/8), 7);  // 16384 keys a block, at most all 7 other ranks'
  EXPECT_EQ(cp::ring_steps_per_block(4096, 8), 4);
  EXPECT_EQ(cp::ring_steps_per_block(8192, 8), 2);
  EXPECT_EQ(cp::ring_steps_per_block(16384, 8), 1);
  EXPECT_EQ(cp::ring_steps_per_block(16, 4), 3);  // at most every step but the own
  EXPECT_EQ(cp::ring_steps_per_block(16, 1), 1);
  auto summary = [](const std::vector<cp::RingGroup>& groups) {
    std::vector<std::vector<int64_t>> rows;
    for (const cp::RingGroup& g : groups) rows.push_back({g.first_step, g.steps, g.first_query, g.queries, g.first_key, g.keys, g.causal});
    return rows;
  };
  const int64_t c = 2048;
  EXPECT_EQ(summary(cp::ring_groups(/*rank=*/3, 8, c, 4)),
            (std::vector<std::vector<int64_t>>{{0, 1, 0, 2 * c, 0, 2 * c, 1}, {1, 3, 0, 2 * c, 0, c, 0}, {4, 4, c, c, 0, 2 * c, 0}}));
  EXPECT_EQ(summary(cp::ring_groups(0, 8, c, 4)),
            (std::vector<std::vector<int64_t>>{{0, 1, 0, 2 * c, 0, 2 * c, 1}, {1, 4, c, c, 0, 2 * c, 0}, {5, 3, c, c, 0, 2 * c, 0}}));
  EXPECT_EQ(cp::ring_groups(5, 8, c, 1).size(), 8u);  // one step a block: the ring as Megatron runs it
  const std::vector<at::Tensor> per_step{at::arange(8).view({1, 1, 8, 1}), at::arange(10, 18).view({1, 1, 8, 1})};
  EXPECT_TRUE(at::equal(cp::group_rows({1, 2, 0, 8, 0, 4, false}, per_step).flatten(), at::tensor({0, 1, 2, 3, 10, 11, 12, 13}, at::kLong)));
}

// Grouped steps give the ring's result: every rank's output and q, k, v gradients equal one
// attention over the whole sequence, on 3 and 4 ranks with 1 to 3 steps a block (the gradients
// travelling 0 to 2 steps behind the keys) and on 6 with one (more blocks than
// BlockOutputs combines at the end), causal and under a mask (a sliding window).
TEST(ContextParallelAttention, RingStepsGroupedEqualOneAttentionOverTheSequence) {
  const int64_t b = 2, heads = 4, groups = 2, d = 8, seq = 24;
  at::manual_seed(13);
  const at::Tensor q = at::randn({b, heads, seq, d}), k = at::randn({b, groups, seq, d}), v = at::randn({b, groups, seq, d});
  const at::Tensor upstream = at::randn({b, heads, seq, d});
  const at::Tensor position = at::arange(seq);
  const at::Tensor window = (position.unsqueeze(0) <= position.unsqueeze(1)).logical_and(position.unsqueeze(1) - position.unsqueeze(0) < 7);
  for (bool masked : {false, true}) {
    const at::Tensor mask = masked ? window.view({1, 1, seq, seq}).expand({b, 1, seq, seq}).contiguous() : at::Tensor();
    const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
    const at::Tensor want = masked ? at::scaled_dot_product_attention(rq, rk, rv, mask, 0.0, false, 0.4, /*enable_gqa=*/true)
                                   : at::scaled_dot_product_attention(rq, rk, rv, std::nullopt, 0.0, true, 0.4, /*enable_gqa=*/true);
    want.backward(upstream);
    // 6 ranks one step a block: more blocks than are combined at the end, merged as they come.
    for (const auto& [ranks, most_per_block] : std::vector<std::pair<int, int>>{{3, 3}, {4, 3}, {6, 1}}) {
      for (int per_block = 1; per_block <= most_per_block; ++per_block) {
        test::on_gloo_ranks(ranks, [&](int rank, const dist::Group& g) {
          auto mine = [&](const at::Tensor& x) { return cp::rank_rows(x, 2, ranks, rank); };
          const at::Tensor lq = mine(q).requires_grad_(), lk = mine(k).requires_grad_(), lv = mine(v).requires_grad_();
          const at::Tensor got = cp::ring_attention(lq, lk, lv, masked ? mine(mask) : at::Tensor(), 0.4, g, nullptr, per_block);
          got.backward(mine(upstream));
          const std::string what = std::to_string(ranks) + " ranks, " + std::to_string(per_block) + " steps a block" +
                                   (masked ? ", window mask" : "") + ", rank " + std::to_string(rank);
          EXPECT_TRUE(at::allclose(got, mine(want), 1e-5, 1e-5)) << what << ": output";
          EXPECT_TRUE(at::allclose(lq.grad(), mine(rq.grad()), 1e-4, 1e-5)) << what << ": dq";
          EXPECT_TRUE(at::allclose(lk.grad(), mine(rk.grad()), 1e-4, 1e-5)) << what << ": dk";
          EXPECT_TRUE(at::allclose(lv.grad(), mine(rv.grad()), 1e-4, 1e-5)) << what << ": dv";
        });
      }
    }
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
// A ring block's rows cut into the documents they share: for rank 1 of 2 (chunks 1 and 2 of 4
// chunks of 4 tokens) over rank 0's early chunk, with documents [0, 3), [3, 10), [10, 16) in each of two
// samples, the pieces are the documents' query and key counts in order; a document with queries
// and no keys is kept (and said), one with neither is dropped.
TEST(ContextParallelAttention, BlockRowsCutIntoTheirDocuments) {
  const cp::PackedDocuments documents{{0, 3, 10, 16, 19, 26, 32}, 2, 16};
  const cp::RingBlock blk = cp::ring_block(/*step=*/1, /*rank=*/1, /*cp=*/2, /*c=*/4);  // rank 0's keys, its early chunk
  const std::vector<cp::Positions> queries = cp::rank_row_positions(1, 2, 4, blk.first_query, blk.queries);
  ASSERT_EQ(queries.size(), 2u);
  EXPECT_EQ(queries[0].first, 4);   // chunk 1
  EXPECT_EQ(queries[1].first, 8);   // chunk 2
  const cp::BlockDocuments pieces =
      cp::block_documents(documents, queries, cp::rank_row_positions(0, 2, 4, blk.first_key, blk.keys), at::Device(at::kCPU));
  // Queries at positions 4..12, keys at 0..4: document [0, 3) keys 3; [3, 10) queries 6 (4..10),
  // key 1 (3); [10, 16) queries 2, no keys. Twice, the second sample's rows after the first's.
  EXPECT_EQ(pieces.query_starts, (std::vector<int32_t>{0, 0, 6, 8, 8, 14, 16}));
  EXPECT_EQ(pieces.key_starts, (std::vector<int32_t>{0, 3, 4, 4, 7, 8, 8}));
  EXPECT_EQ(pieces.longest_queries, 6);
  EXPECT_EQ(pieces.longest_keys, 3);
  EXPECT_TRUE(pieces.queries_without_keys);
  EXPECT_FALSE(pieces.device_query_starts.defined());
  EXPECT_EQ(pieces.queries, 8);
  EXPECT_EQ(pieces.keys, 4);

  // Cut down to what the documents share: only [3, 10) is on both sides, its 6 query rows (rows
  // 0-5) over its 1 key row (row 3), in each sample.
  const cp::BlockDocuments shared =
      cp::shared_documents(documents, queries, cp::rank_row_positions(0, 2, 4, blk.first_key, blk.keys), at::Device(at::kCPU));
  EXPECT_EQ(shared.first_query, 0);
  EXPECT_EQ(shared.queries, 6);
  EXPECT_EQ(shared.first_key, 3);
  EXPECT_EQ(shared.keys, 1);
  EXPECT_EQ(shared.query_starts, (std::vector<int32_t>{0, 6, 12}));
  EXPECT_EQ(shared.key_starts, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(shared.queries_without_keys);
  // Documents that end at the chunk boundary: the block shares nothing, and has no rows.
  const cp::PackedDocuments apart{{0, 4, 16, 20, 32}, 2, 16};
  EXPECT_EQ(cp::shared_documents(apart, queries, cp::rank_row_positions(0, 2, 4, blk.first_key, blk.keys), at::Device(at::kCPU)).queries, 0);
}

// The pieces' attention equals the block's under the documents' mask: output, log-sum-exp (-inf
// where a query's document has no key here) and the backward, for a full block and a causal one.
TEST(ContextParallelAttention, DocumentPiecesEqualTheBlockUnderTheDocumentsMask) {
  at::manual_seed(8);
  const cp::PackedDocuments documents{{0, 3, 10, 16, 19, 26, 32}, 2, 16};
  const at::Tensor document = at::tensor({0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2}, at::kLong);  // both samples alike
  const int64_t b = 2, heads = 4, groups = 2, d = 8, c = 4;
  for (int step = 0; step < 2; ++step) {
    const cp::RingBlock blk = cp::ring_block(step, 1, 2, c);
    const std::vector<cp::Positions> qpos = cp::rank_row_positions(1, 2, c, blk.first_query, blk.queries);
    const std::vector<cp::Positions> kpos = cp::rank_row_positions(blk.owner, 2, c, blk.first_key, blk.keys);
    auto positions = [](const std::vector<cp::Positions>& runs) {
      std::vector<at::Tensor> parts;
      for (const cp::Positions& r : runs) parts.push_back(at::arange(r.first, r.first + r.count, at::kLong));
      return at::cat(parts);
    };
    const at::Tensor qp = positions(qpos), kp = positions(kpos);
    const at::Tensor mask = (document.index_select(0, qp).unsqueeze(1) == document.index_select(0, kp).unsqueeze(0))
                                .logical_and(kp.unsqueeze(0) <= qp.unsqueeze(1))
                                .view({1, 1, qp.size(0), kp.size(0)})
                                .expand({b, 1, -1, -1});
    const at::Tensor q = at::randn({b, heads, qp.size(0), d}, at::kDouble), k = at::randn({b, groups, kp.size(0), d}, at::kDouble),
                     v = at::randn({b, groups, kp.size(0), d}, at::kDouble), dout = at::randn({b, heads, qp.size(0), d}, at::kDouble);
    const cp::BlockDocuments pieces = cp::block_documents(documents, qpos, kpos, at::Device(at::kCPU));
    const cp::PartialAttention got = cp::attend_documents(q, k, v, pieces, blk.causal, 0.3);
    const cp::PartialAttention want = cp::attend_block(q, k, v, blk.causal, mask, 0.3);
    const std::string what = "step " + std::to_string(step);
    EXPECT_TRUE(at::equal(got.lse.isinf(), want.lse.isinf())) << what;
    EXPECT_TRUE(at::allclose(got.lse.masked_fill(got.lse.isinf(), 0), want.lse.masked_fill(want.lse.isinf(), 0), 1e-6, 1e-6)) << what;
    EXPECT_TRUE(at::allclose(got.out, want.out, 1e-6, 1e-6)) << what;
    const at::Tensor lse = want.lse.masked_fill(want.lse.isinf(), 0.0), out = want.out;
    const cp::BlockGrads g = cp::attend_documents_backward(dout, q, k, v, out, lse, pieces, blk.causal, 0.3);
    const cp::BlockGrads w = cp::attend_block_backward(dout, q, k, v, out, lse, blk.causal, mask, 0.3);
    EXPECT_TRUE(at::allclose(g.dq, w.dq, 1e-6, 1e-6)) << what;
    EXPECT_TRUE(at::allclose(g.dk, w.dk, 1e-6, 1e-6)) << what;
    EXPECT_TRUE(at::allclose(g.dv, w.dv, 1e-6, 1e-6)) << what;
  }
}

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
