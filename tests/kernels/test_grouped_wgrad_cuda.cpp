// The grouped weight-gradient GEMM whose epilogue adds into main_grad (src/kernels/cutlass/,
// kernels::grouped_weight_grad_into) against the same sums in fp64: fp32 and bf16 main_grads,
// the step's first gradient written over stale contents and a later one added, groups without
// rows first, inside and last, and a CUDA graph replaying it. Runs on an sm_90 GPU in a build
// with CUTLASS (scripts/gpu/run.sh); elsewhere it reports a skip, never a pass.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/cuda_device.h"
#include "kernels/grouped_wgrad_ops.h"
#include "train/step_graph.h"

namespace megatron {
namespace {

#define REQUIRE_GROUPED_WGRAD()                                                                                 \
  if (!at::hasCUDA()) GTEST_SKIP() << "needs a CUDA device; scripts/gpu/run.sh runs this there";                \
  if (!kernels::built_with_grouped_wgrad()) GTEST_SKIP() << "needs a build with CUTLASS's headers";              \
  if (cuda_compute_capability_major(at::Device(at::kCUDA, 0)) != 9) GTEST_SKIP() << "the kernel is built for sm_90a alone"

struct Problem {
  at::Tensor dy, x, ends;   // [rows, out], [rows, in] bf16; int32 [groups]
  std::vector<int64_t> rows;
};

// Rows per group with empty groups first, inside and last; the sizes of an expert's share of a
// micro-batch (hundreds of rows) next to one-row and odd-sized groups.
Problem make_problem(int64_t out, int64_t in) {
  Problem p;
  p.rows = {0, 37, 300, 0, 1, 128, 517, 0};
  int64_t total = 0;
  for (int64_t r : p.rows) total += r;
  const auto on = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  p.dy = at::randn({total, out}, on);
  p.x = at::randn({total, in}, on);
  p.ends = at::tensor(p.rows, at::kLong).cumsum(0).to(at::kInt).cuda();
  return p;
}

// [groups, out, in] fp64: dy_g^T x_g per group.
at::Tensor reference_grads(const Problem& p) {
  const at::Tensor dy = p.dy.to(at::kDouble).cpu(), x = p.x.to(at::kDouble).cpu();
  std::vector<at::Tensor> grads;
  int64_t begin = 0;
  for (int64_t r : p.rows) {
    grads.push_back(at::mm(dy.narrow(0, begin, r).t(), x.narrow(0, begin, r)));
    begin += r;
  }
  return at::stack(grads);
}

double max_error(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble).cpu() - want).abs().max().item<double>();
}

class GroupedWgrad : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(GroupedWgrad, OverwritesThenAddsIntoMainGrads) {
  REQUIRE_GROUPED_WGRAD();
  const at::ScalarType main_type = GetParam();
  for (const auto& [out, in] : std::vector<std::pair<int64_t, int64_t>>{{384, 256}, {256, 136}}) {
    const Problem first = make_problem(out, in), second = make_problem(out, in);
    const int64_t groups = int64_t(first.rows.size());
    const at::Tensor main_grads = at::full({groups, out, in}, 7.0, first.dy.options().dtype(main_type));  // stale
    ASSERT_TRUE(kernels::grouped_weight_grad_supported(main_grads, first.dy, first.x, first.ends))
        << "an sm_90 GPU in a CUTLASS build must take " << out << " x " << in;

    const at::Tensor want_first = reference_grads(first);
    kernels::grouped_weight_grad_into(main_grads, first.dy, first.x, first.ends, /*accumulate=*/false);
    // bf16 inputs, fp32 accumulation: the error is the output's rounding (bf16: 2^-8 of the
    // largest sums, ~sqrt(517) * 4) or fp32's over hundreds of products.
    const double scale = want_first.abs().max().item<double>();
    const double tol = main_type == at::kBFloat16 ? scale / 128 : scale * 1e-5;
    EXPECT_LE(max_error(main_grads, want_first), tol) << out << " x " << in << ": the first gradient, over stale 7s";
    for (int64_t g = 0; g < groups; ++g) {
      if (first.rows[size_t(g)] == 0) {
        EXPECT_EQ(main_grads[g].abs().max().item<double>(), 0.0) << "group " << g << " has no rows: zeros, not the stale 7s";
      }
    }

    kernels::grouped_weight_grad_into(main_grads, second.dy, second.x, second.ends, /*accumulate=*/true);
    EXPECT_LE(max_error(main_grads, want_first + reference_grads(second)), 2 * tol) << out << " x " << in << ": added";
  }
}

TEST_P(GroupedWgrad, ReplaysFromACudaGraph) {
  REQUIRE_GROUPED_WGRAD();
  const at::ScalarType main_type = GetParam();
  const Problem p = make_problem(256, 256);
  const int64_t groups = int64_t(p.rows.size());
  const at::Tensor eager = at::zeros({groups, 256, 256}, p.dy.options().dtype(main_type));
  const at::Tensor captured = eager.clone();
  kernels::grouped_weight_grad_into(eager, p.dy, p.x, p.ends, false);
  for (int i = 0; i < 2; ++i) kernels::grouped_weight_grad_into(eager, p.dy, p.x, p.ends, true);
  const at::Tensor eager_sums = eager.cpu();  // waits for the default stream, before the graph's own

  StepGraph graph(at::Device(at::kCUDA, 0));  // its own stream, current from here on
  graph.capture([&] { kernels::grouped_weight_grad_into(captured, p.dy, p.x, p.ends, true); });
  // Overwrite, then two replays: the eager sequence's three calls.
  kernels::grouped_weight_grad_into(captured, p.dy, p.x, p.ends, false);
  graph.replay();
  graph.replay();
  EXPECT_TRUE(at::equal(captured.cpu(), eager_sums)) << "replayed accumulation differs from the eager calls";

  // The graph reads the ends on the device at replay: new counts, new sums.
  const at::Tensor moved = at::tensor(std::vector<int64_t>{100, 0, 300, 0, 1, 128, 454, 0}, at::kLong).cumsum(0).to(at::kInt);
  p.ends.copy_(moved);
  captured.zero_();
  graph.replay();
  const at::Tensor dy = p.dy.to(at::kDouble).cpu(), x = p.x.to(at::kDouble).cpu();
  const at::Tensor want = at::mm(dy.narrow(0, 0, 100).t(), x.narrow(0, 0, 100));
  const double tol = want.abs().max().item<double>() * (main_type == at::kBFloat16 ? 1.0 / 128 : 1e-5);
  EXPECT_LE(max_error(captured[0], want), tol) << "the replay read the new ends";
  EXPECT_EQ(captured[1].abs().max().item<double>(), 0.0) << "an empty group is left as it was (added: nothing)";
}

INSTANTIATE_TEST_SUITE_P(MainGradTypes, GroupedWgrad, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) { return std::string(info.param == at::kFloat ? "Fp32" : "Bf16"); });

}  // namespace
}  // namespace megatron
