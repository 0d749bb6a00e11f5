// The ring's blocks on the GPU (skipped without one): the fused kernels (cuDNN's on Hopper, FA2's) in bf16 against
// the explicit fp32 arithmetic on the same inputs, for the three block shapes of the ring (own
// block causal, 2c queries over c keys, c queries over 2c keys) with grouped-query heads: the
// output, the log-sum-exp, and the backward from merged statistics.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <limits>
#include <utility>
#include <string>
#include <vector>

#include "context_parallel/document_blocks.h"
#include "context_parallel/partial_attention.h"
#include "context_parallel/ring_attention.h"
#include "core/cuda_device.h"
#include "kernels/attention_ops.h"
#include "support/gloo_ranks.h"

namespace megatron {
namespace {

double relative(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kFloat) - want.to(at::kFloat)).norm().item<double>() / std::max(want.to(at::kFloat).norm().item<double>(), 1e-12);
}

// Each fused kernel's blocks (cuDNN's where this GPU has it, FA2's) against the fp32 arithmetic:
// outputs, log-sum-exps (the merge needs them in natural log), and the gradients from merged
// statistics; GQA's key/value heads shared by 4 query heads each.
TEST(ContextParallelCuda, FusedBlocksEqualTheArithmetic) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(3);
  const int64_t b = 2, heads = 8, groups = 2, c = 256, d = 64;
  const at::TensorOptions bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor q = at::randn({b, heads, 2 * c, d}, bf16), k = at::randn({b, groups, 2 * c, d}, bf16),
                   v = at::randn({b, groups, 2 * c, d}, bf16), dout = at::randn({b, heads, 2 * c, d}, bf16);
  const double scale = 0.125;
  std::vector<cp::BlockKernel> kernels = {cp::BlockKernel::Flash};
  if (cuda_compute_capability_major(q.device()) == 9) kernels.push_back(cp::BlockKernel::Cudnn);
  for (cp::BlockKernel kernel : kernels) {
    const char* name = kernel == cp::BlockKernel::Flash ? "FA2" : "cuDNN";
    // Rank 1 of 3: step 0 its own block, step 1 rank 0's (earlier), step 2 rank 2's (later).
    for (int step = 0; step < 3; ++step) {
      const cp::RingBlock blk = cp::ring_block(step, 1, 3, c);
      const at::Tensor bq = q.narrow(2, blk.first_query, blk.queries), bk = k.narrow(2, blk.first_key, blk.keys),
                       bv = v.narrow(2, blk.first_key, blk.keys), bdout = dout.narrow(2, blk.first_query, blk.queries);
      const cp::PartialAttention fused = cp::attend_block(bq, bk, bv, blk.causal, at::Tensor(), scale, kernel);
      const cp::PartialAttention exact = cp::attend_block(bq.to(at::kFloat), bk.to(at::kFloat), bv.to(at::kFloat), blk.causal,
                                                          at::Tensor(), scale, cp::BlockKernel::Arithmetic);
      EXPECT_LT(relative(fused.out, exact.out), 1e-2) << name << " step " << step;
      EXPECT_LT(relative(fused.lse, exact.lse), 1e-3) << name << " step " << step;
      const at::Tensor out = exact.out.to(at::kBFloat16);
      const cp::BlockGrads fg = cp::attend_block_backward(bdout, bq, bk, bv, out, exact.lse, blk.causal, at::Tensor(), scale, kernel);
      const cp::BlockGrads eg =
          cp::attend_block_backward(bdout.to(at::kFloat), bq.to(at::kFloat), bk.to(at::kFloat), bv.to(at::kFloat), out.to(at::kFloat),
                                    exact.lse, blk.causal, at::Tensor(), scale, cp::BlockKernel::Arithmetic);
      EXPECT_LT(relative(fg.dq, eg.dq), 2e-2) << name << " step " << step;
      EXPECT_LT(relative(fg.dk, eg.dk), 2e-2) << name << " step " << step;
      EXPECT_LT(relative(fg.dv, eg.dv), 2e-2) << name << " step " << step;
    }
  }
}

// The merge's one-pass kernel against ATen's composite of it: a block of rows in the middle of
// the accumulator, the block's output strided as cuDNN returns it ([b, s, H, d] in memory), in
// bf16 and fp32; rows where the accumulator, the block or both saw no key (-inf).
TEST(ContextParallelCuda, MergeKernelEqualsTheComposite) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(5);
  const int64_t b = 2, heads = 4, total = 96, first = 32, rows = 48;
  const at::TensorOptions fp32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const double inf = std::numeric_limits<double>::infinity();
  // 72 channels in packs of 4, 18 one at a time.
  for (const int64_t dv : {72, 18})
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    SCOPED_TRACE(testing::Message() << "dv " << dv);
    at::Tensor acc_out = at::randn({b, heads, total, dv}, fp32), acc_lse = at::randn({b, heads, total}, fp32);
    const at::Tensor part_out = at::randn({b, rows, heads, dv}, fp32).to(dtype).transpose(1, 2);  // strided, as cuDNN's
    at::Tensor part_lse = at::randn({b, heads, rows}, fp32);
    acc_lse.narrow(2, first, 4).fill_(-inf);   // the accumulator saw nothing there, the block did
    part_lse.narrow(2, 4, 4).fill_(-inf);      // the block saw nothing there
    acc_lse.narrow(2, first + 8, 4).fill_(-inf);
    part_lse.narrow(2, 8, 4).fill_(-inf);      // neither
    acc_out.narrow(2, first + 8, 4).zero_();   // (an accumulator row without keys is zero)
    at::Tensor want_out = acc_out.clone(), want_lse = acc_lse.clone();
    kernels::attention_merge(want_out.narrow(2, first, rows), want_lse.narrow(2, first, rows), part_out, part_lse,
                             kernels::Impl::Composite);
    kernels::attention_merge(acc_out.narrow(2, first, rows), acc_lse.narrow(2, first, rows), part_out, part_lse);
    EXPECT_LT(relative(acc_out, want_out), 1e-6) << dtype;
    EXPECT_TRUE(at::equal(acc_lse.isinf(), want_lse.isinf())) << dtype;
    const at::Tensor finite = want_lse.isfinite();
    EXPECT_LT((acc_lse.masked_select(finite) - want_lse.masked_select(finite)).abs().max().item<double>(), 1e-5) << dtype;
    EXPECT_EQ(acc_out.narrow(2, first + 8, 4).abs().max().item<double>(), 0.0) << dtype;
    EXPECT_FALSE(acc_out.isnan().any().item<bool>()) << dtype;
  }
}

// The ring's blocks combined once (attention_combine's kernel) against ATen's composite of it:
// three parts as a rank's own block and two groups leave them (every row; all rows; the late
// half, strided as cuDNN returns it), rows where a part or every part saw no key (-inf), in bf16
// and fp32; then the query gradients' sum (no log-sum-exps).
TEST(ContextParallelCuda, CombineKernelEqualsTheComposite) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(6);
  const int64_t b = 2, heads = 4, rows = 96;
  const at::TensorOptions fp32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const double inf = std::numeric_limits<double>::infinity();
  // 64 channels in 16-byte packs; 20: fp32 in packs, bf16 one at a time; 136: more packs than a warp's lanes in fp32.
  for (const int64_t dv : {64, 20, 136})
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    SCOPED_TRACE(testing::Message() << "dv " << dv);
    std::vector<kernels::CombinedPart> parts{
        {at::randn({b, heads, rows, dv}, fp32).to(dtype), at::randn({b, heads, rows}, fp32), 0},
        {at::randn({b, heads, rows, dv}, fp32).to(dtype), at::randn({b, heads, rows}, fp32), 0},
        {at::randn({b, rows / 2, heads, dv}, fp32).to(dtype).transpose(1, 2), at::randn({b, heads, rows / 2}, fp32), rows / 2}};
    parts[1].lse.narrow(2, 10, 4).fill_(-inf);  // the second part saw nothing there
    for (auto& p : parts) p.lse.narrow(2, 60 - p.first_row, 4).fill_(-inf);  // no part did
    for (auto& p : parts) p.out.narrow(2, 60 - p.first_row, 4).zero_();      // (a row without keys is zero)
    at::Tensor lse = at::empty({b, heads, rows}, fp32), want_lse = at::empty({b, heads, rows}, fp32);
    const at::Tensor want = kernels::attention_combine(parts, rows, want_lse, kernels::Impl::Composite);
    const at::Tensor got = kernels::attention_combine(parts, rows, lse);
    EXPECT_EQ(got.scalar_type(), dtype);
    EXPECT_LT(relative(got, want), dtype == at::kFloat ? 1e-6 : 4e-3) << dtype;
    EXPECT_TRUE(at::equal(lse.isinf(), want_lse.isinf())) << dtype;
    const at::Tensor finite = want_lse.isfinite();
    EXPECT_LT((lse.masked_select(finite) - want_lse.masked_select(finite)).abs().max().item<double>(), 1e-5) << dtype;
    EXPECT_EQ(got.narrow(2, 60, 4).abs().max().item<double>(), 0.0) << dtype;
    EXPECT_FALSE(got.isnan().any().item<bool>()) << dtype;
    // The gradients' sum: the same parts without log-sum-exps.
    std::vector<kernels::CombinedPart> grads;
    for (const auto& p : parts) grads.push_back({p.out, at::Tensor(), p.first_row});
    const at::Tensor sum = kernels::attention_combine(grads, rows, at::Tensor());
    const at::Tensor want_sum = kernels::attention_combine(grads, rows, at::Tensor(), kernels::Impl::Composite);
    EXPECT_LT(relative(sum, want_sum), dtype == at::kFloat ? 1e-6 : 4e-3) << dtype;
    const at::Tensor by_hand = parts[0].out.to(at::kFloat) + parts[1].out.to(at::kFloat);
    EXPECT_LT(relative(sum.narrow(2, 0, rows / 2), by_hand.narrow(2, 0, rows / 2)), dtype == at::kFloat ? 1e-6 : 4e-3) << dtype;
  }
}

// The key/value gradient shares into the ring's fp32 sums (one launch for both) against ATen's
// add_ / copy_: views as the ring makes them (rows of the packed sum, one step's rows of a group's
// gradients), added and written over, bf16 and fp32, a value head narrower than the key's (MLA),
// a head dim that leaves the packs (one element at a time), and gradients laid out [b, s, G, d]
// as FA2 hands them (rows strided by G d).
TEST(ContextParallelCuda, KeyValueGradsKernelEqualsTheComposite) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(7);
  const int64_t b = 2, groups = 3, c = 41, steps = 3;  // 41 rows: 10 and 6 channels leave the packs
  const at::TensorOptions fp32 = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  for (const auto [d, dv] : {std::pair<int64_t, int64_t>{64, 64}, {96, 64}, {10, 6}})
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat})
  for (const bool overwrite : {false, true})
  for (const bool transposed : {false, true}) {
    SCOPED_TRACE(testing::Message() << "d " << d << ", dv " << dv << ", " << dtype << (overwrite ? ", overwrite" : ", add")
                                    << (transposed ? ", [b, s, G, d] gradients" : ""));
    const int64_t k_numel = b * groups * 2 * c * d, numel = k_numel + b * groups * 2 * c * dv;
    const at::Tensor packed = at::randn({numel}, fp32);
    auto sum_k = [&](const at::Tensor& flat) { return flat.narrow(0, 0, k_numel).view({b, groups, 2 * c, d}).narrow(2, c, c); };
    auto sum_v = [&](const at::Tensor& flat) { return flat.narrow(0, k_numel, numel - k_numel).view({b, groups, 2 * c, dv}).narrow(2, c, c); };
    // A group's gradients over three steps' keys side by side; this share is the middle step's.
    auto gradient = [&](int64_t dim) {
      const at::Tensor g = transposed ? at::randn({b, steps * c, groups, dim}, fp32).to(dtype).transpose(1, 2)
                                      : at::randn({b, groups, steps * c, dim}, fp32).to(dtype);
      return g.narrow(2, c, c);
    };
    const at::Tensor dk = gradient(d), dv_ = gradient(dv);
    ASSERT_EQ(dk.stride(2), transposed ? groups * d : d);
    at::Tensor got = packed.clone(), want = packed.clone();
    kernels::add_key_value_grads(sum_k(want), sum_v(want), dk, dv_, overwrite, kernels::Impl::Composite);
    kernels::add_key_value_grads(sum_k(got), sum_v(got), dk, dv_, overwrite);
    EXPECT_TRUE(at::equal(got, want)) << "max difference " << (got - want).abs().max().item<double>();
    EXPECT_FALSE(at::equal(got, packed)) << "the sums changed";
  }
}

// The ring on the GPU end to end, as a rank of one runs it (no exchange; one process cannot hold
// two NCCL ranks on one device): the own block in the fused kernel, the blocks combined, the key
// and value gradients started in the fp32 sum by the share kernel, written over, and cast back,
// against SDPA over the same tokens, in bf16 with grouped-query heads.
TEST(ContextParallelCuda, RingOfOneRankEqualsSdpa) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(8);
  const int64_t b = 2, heads = 8, groups = 2, seq = 256, d = 64;
  const at::TensorOptions bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor q = at::randn({b, heads, seq, d}, bf16), k = at::randn({b, groups, seq, d}, bf16),
                   v = at::randn({b, groups, seq, d}, bf16), upstream = at::randn({b, heads, seq, d}, bf16);
  const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(), rv = v.clone().requires_grad_();
  const at::Tensor want = at::scaled_dot_product_attention(rq, rk, rv, std::nullopt, 0.0, true, 0.125, /*enable_gqa=*/true);
  want.backward(upstream);
  test::on_gloo_ranks(1, [&](int, const dist::Group& g) {
    const at::Tensor lq = q.clone().requires_grad_(), lk = k.clone().requires_grad_(), lv = v.clone().requires_grad_();
    const at::Tensor got = cp::ring_attention(lq, lk, lv, at::Tensor(), 0.125, g);
    got.backward(upstream);
    EXPECT_EQ(lk.grad().scalar_type(), at::kBFloat16);
    EXPECT_LT(relative(got, want), 1e-2);
    EXPECT_LT(relative(lq.grad(), rq.grad()), 2e-2);
    EXPECT_LT(relative(lk.grad(), rk.grad()), 2e-2);
    EXPECT_LT(relative(lv.grad(), rv.grad()), 2e-2);
  });
}

// Packed documents: FlashAttention-2's variable-length kernel over a ring block's document pieces
// against each piece's fp32 arithmetic, on every block of rank 1 of 3 with two samples of uneven
// documents: pieces with queries and no keys (log-sum-exp -inf, output zero), keys and no
// queries (zero gradients), and documents across the chunk boundaries; MLA's narrower value heads.
TEST(ContextParallelCuda, DocumentPiecesEqualTheArithmetic) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(5);
  const int cp = 3, rank = 1;
  const int64_t b = 2, heads = 8, groups = 2, c = 128, d = 64, seq = 2 * cp * c;
  const at::TensorOptions bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor q = at::randn({b, heads, 2 * c, d}, bf16), k = at::randn({b, groups, 2 * c, d}, bf16);
  // The keys each step holds are the owner's rows; the same tensors stand in for every owner.
  cp::PackedDocuments documents{{0}, b, seq};
  for (int64_t sample = 0; sample < b; ++sample) {
    for (int64_t length : {100, 300, 37, 5, 200}) documents.starts.push_back(documents.starts.back() + int32_t(length));
    documents.starts.push_back(int32_t((sample + 1) * seq));  // the rest of the sample
  }
  const double scale = 0.125;
  // The value head dim of q's, and a narrower one (multi-latent attention's, padded for the kernel).
  for (const int64_t value_dim : {d, int64_t(48)}) {
    const at::Tensor v = at::randn({b, groups, 2 * c, value_dim}, bf16), dout = at::randn({b, heads, 2 * c, value_dim}, bf16);
    for (int step = 0; step < cp; ++step) {
      const cp::RingBlock blk = cp::ring_block(step, rank, cp, c);
      const std::string where = "value dim " + std::to_string(value_dim) + ", step " + std::to_string(step);
      const cp::BlockDocuments pieces =
          cp::block_documents(documents, cp::rank_row_positions(rank, cp, c, blk.first_query, blk.queries),
                              cp::rank_row_positions(blk.owner, cp, c, blk.first_key, blk.keys), q.device());
      const at::Tensor bq = q.narrow(2, blk.first_query, blk.queries), bk = k.narrow(2, blk.first_key, blk.keys),
                       bv = v.narrow(2, blk.first_key, blk.keys), bdout = dout.narrow(2, blk.first_query, blk.queries);
      const cp::PartialAttention fused = cp::attend_documents(bq, bk, bv, pieces, blk.causal, scale, cp::BlockKernel::Flash);
      const cp::PartialAttention exact = cp::attend_documents(bq.to(at::kFloat), bk.to(at::kFloat), bv.to(at::kFloat), pieces,
                                                              blk.causal, scale, cp::BlockKernel::Arithmetic);
      const at::Tensor unseen = exact.lse.isinf();  // queries whose document has no keys in this block
      EXPECT_TRUE(at::equal(fused.lse.isneginf(), unseen)) << where << ": -inf exactly where no key was seen";
      EXPECT_LT(relative(fused.lse.masked_fill(unseen, 0), exact.lse.masked_fill(unseen, 0)), 1e-3) << where;
      EXPECT_LT(relative(fused.out, exact.out), 1e-2) << where;
      // The backward from statistics that saw keys elsewhere (the merged ones): here the block's own
      // where it saw any, and 0 for the rest.
      const at::Tensor lse = exact.lse.masked_fill(unseen, 0.0), out = exact.out.to(at::kBFloat16);
      const cp::BlockGrads fg = cp::attend_documents_backward(bdout, bq, bk, bv, out, lse, pieces, blk.causal, scale, cp::BlockKernel::Flash);
      const cp::BlockGrads eg =
          cp::attend_documents_backward(bdout.to(at::kFloat), bq.to(at::kFloat), bk.to(at::kFloat), bv.to(at::kFloat), out.to(at::kFloat),
                                        lse, pieces, blk.causal, scale, cp::BlockKernel::Arithmetic);
      EXPECT_LT(relative(fg.dq, eg.dq), 2e-2) << where;
      EXPECT_LT(relative(fg.dk, eg.dk), 2e-2) << where;
      EXPECT_LT(relative(fg.dv, eg.dv), 2e-2) << where;
      if (unseen.any().item<bool>()) {
        EXPECT_EQ(fg.dq.masked_select(unseen.unsqueeze(-1)).abs().max().item<float>(), 0.0f) << where << ": queries without keys";
      }
    }
  }
}

}  // namespace
}  // namespace megatron
