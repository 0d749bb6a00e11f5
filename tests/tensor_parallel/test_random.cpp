// The model-parallel generator: TP ranks draw different dropout masks inside the TP region,
// forking leaves the default generator exactly where it was, and the same seed and rank give
// the same draws (what resuming relies on).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "tensor_parallel/random.h"

namespace megatron {
namespace {

at::Tensor mask(tp::RngTracker& tracker) {
  return tracker.fork([] { return at::dropout(at::ones({1000}), 0.5, /*train=*/true); });
}

TEST(RngTracker, RanksDrawIndependentlyAndTheDefaultGeneratorIsUntouched) {
  at::manual_seed(1234);
  const at::Tensor before = at::detail::getDefaultCPUGenerator().get_state();
  tp::RngTracker rank0(1234, 0, /*cuda=*/false), rank1(1234, 1, false), rank0_again(1234, 0, false);
  const at::Tensor a = mask(rank0), b = mask(rank1), c = mask(rank0_again);
  EXPECT_TRUE(at::equal(at::detail::getDefaultCPUGenerator().get_state(), before));
  EXPECT_FALSE(at::equal(a, b));
  EXPECT_TRUE(at::equal(a, c));
  // The tracker advances: the next mask differs from the first, and restoring the state repeats it.
  const at::Tensor state = rank0.cpu_state();
  const at::Tensor second = mask(rank0);
  EXPECT_FALSE(at::equal(a, second));
  rank0.set_states(state, at::Tensor());
  EXPECT_TRUE(at::equal(mask(rank0), second));
}

}  // namespace
}  // namespace megatron
