// The ring's blocks on the GPU (skipped without one): the fused kernels (cuDNN's on Hopper, FA2's) in bf16 against
// the explicit fp32 arithmetic on the same inputs, for the three block shapes of the ring (own
// block causal, 2c queries over c keys, c queries over 2c keys) with grouped-query heads: the
// output, the log-sum-exp, and the backward from merged statistics.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <vector>

#include "context_parallel/partial_attention.h"
#include "context_parallel/ring_attention.h"
#include "core/cuda_device.h"

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

}  // namespace
}  // namespace megatron
