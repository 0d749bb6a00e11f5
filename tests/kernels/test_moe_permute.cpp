// The MoE permutations (kernels/moe_ops.h) against their definitions written out as loops, in
// fp64 on the CPU: forward values and the gradients of tokens, rows and probabilities, with
// pairs not dispatched here (slot -1) and padding rows (pair -1). The CUDA kernels are checked
// against the same composite in tests/kernels/test_fused_kernels_cuda.cpp.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "kernels/moe_ops.h"

namespace megatron {
namespace {

// A routing of T tokens to top-k of E experts, grouped by expert as the dispatcher does, with
// every third pair left out (another rank's expert) and a padding row after each expert.
struct Maps {
  at::Tensor pairs, slots;
  int64_t tokens, topk;
};

Maps make_maps(int64_t tokens, int64_t topk, int64_t experts) {
  const at::Tensor expert = at::randint(0, experts, {tokens * topk}, at::kLong);
  std::vector<int64_t> pairs;
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t p = 0; p < tokens * topk; ++p) {
      if (expert[p].item<int64_t>() == e && p % 3 != 0) pairs.push_back(p);
    }
    pairs.push_back(-1);
  }
  std::vector<int64_t> slots(size_t(tokens * topk), -1);
  for (size_t r = 0; r < pairs.size(); ++r) {
    if (pairs[r] >= 0) slots[size_t(pairs[r])] = int64_t(r);
  }
  return {at::tensor(pairs, at::kLong), at::tensor(slots, at::kLong), tokens, topk};
}

TEST(MoePermute, MatchesTheDefinitionForwardAndBackward) {
  at::manual_seed(3);
  const int64_t h = 24;
  const Maps m = make_maps(/*tokens=*/10, /*topk=*/3, /*experts=*/4);
  const int64_t rows = m.pairs.numel();
  const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor tokens = at::randn({m.tokens, h}, f64).requires_grad_(true);
  const at::Tensor expert_out = at::randn({rows, h}, f64).requires_grad_(true);
  const at::Tensor probs = at::rand({m.tokens, m.topk}, f64).requires_grad_(true);
  const at::Tensor grad_rows = at::randn({rows, h}, f64), grad_out = at::randn({m.tokens, h}, f64);

  const at::Tensor permuted = kernels::moe_permute(tokens, m.pairs, m.slots, m.topk);
  const at::Tensor combined = kernels::moe_unpermute(expert_out, probs, m.pairs, m.slots);
  const auto grads = torch::autograd::grad({permuted, combined}, {tokens, expert_out, probs}, {grad_rows, grad_out});

  // The definitions, element by element.
  at::Tensor want_rows = at::zeros({rows, h}, f64), want_out = at::zeros({m.tokens, h}, f64);
  at::Tensor want_dtokens = at::zeros({m.tokens, h}, f64), want_drows = at::zeros({rows, h}, f64);
  at::Tensor want_dprobs = at::zeros({m.tokens, m.topk}, f64);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = m.pairs[r].item<int64_t>();
    if (p < 0) continue;  // padding: a zero row, no gradient anywhere
    const int64_t t = p / m.topk, j = p % m.topk;
    want_rows[r] = tokens[t].detach();
    want_dtokens[t] += grad_rows[r];
    want_out[t] += probs[t][j].detach() * expert_out[r].detach();
    want_drows[r] = probs[t][j].detach() * grad_out[t];
    want_dprobs[t][j] = (grad_out[t] * expert_out[r].detach()).sum();
  }
  EXPECT_TRUE(at::allclose(permuted, want_rows, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(combined, want_out, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(grads[0], want_dtokens, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(grads[1], want_drows, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(grads[2], want_dprobs, 1e-12, 1e-12));
}

TEST(MoePermute, RejectsMapsThatDoNotFit) {
  const Maps m = make_maps(4, 2, 2);
  const at::Tensor tokens = at::randn({5, 8});  // 5 tokens for 8 slots of top-2
  EXPECT_THROW(kernels::moe_permute(tokens, m.pairs, m.slots, m.topk), c10::Error);
  const at::Tensor rows = at::randn({m.pairs.numel() + 1, 8});
  EXPECT_THROW(kernels::moe_unpermute(rows, at::rand({4, 2}), m.pairs, m.slots), c10::Error);
}

}  // namespace
}  // namespace megatron
