// --optimizer-cpu-offload: the offloaded parameters' state lives on the host and steps there,
// chunk by chunk through the staging buffers, with the same result as stepping it where the
// parameters are: bit for bit on the CPU (the same kernel; bf16 weights with remainder masters
// round the same way), within rounding on CUDA (the CPU's fused AdamW against ours). Megatron's fraction rule picks the parameters; the host memory check
// names what to change.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/errors.h"
#include "distributed/parallel_state.h"
#include "optim/adamw.h"
#include "optim/host_optimizer.h"

namespace megatron {
namespace {

struct OptimizerRun {
  std::vector<at::Tensor> params;
  std::unique_ptr<ParamAndGradBuffer> buffer;
  std::unique_ptr<AdamW> adamw;
};

// Three parameters (2560, 40 and 1536 elements) stepped three times with the same gradients.
OptimizerRun run_steps(TrainConfig config, at::Device device, at::ScalarType dtype, int64_t chunk) {
  at::manual_seed(9);
  const std::vector<std::string> names = {"a.weight", "a.bias", "b.weight"};
  const std::vector<std::vector<int64_t>> shapes = {{64, 40}, {40}, {24, 64}};
  OptimizerRun r;
  std::vector<NamedTensor> named;
  for (size_t i = 0; i < names.size(); ++i) {
    r.params.push_back(at::randn(shapes[i]).to(device, dtype).requires_grad_());
    named.push_back({names[i], r.params.back()});
  }
  r.buffer = std::make_unique<ParamAndGradBuffer>(named, dist::ParallelState::single(), GradBufferOptions{});
  r.adamw = std::make_unique<AdamW>(std::vector<ParamAndGradBuffer*>{r.buffer.get()}, config, chunk);
  for (int step = 0; step < 3; ++step) {
    r.buffer->zero_grad();
    for (const BufferedParam& p : r.buffer->params()) p.main_grad.copy_(at::randn(p.main_grad.sizes()) * (step + 1));
    r.adamw->set_learning_rate(1e-2 * (step + 1));
    EXPECT_TRUE(r.adamw->step(r.adamw->grad_norm()).item<bool>());
  }
  return r;
}

TrainConfig offload_config(double fraction, bool overlap) {
  TrainConfig c;
  c.weight_decay = 0.1;
  c.clip_grad = 1.0;
  c.use_precision_aware_optimizer = true;
  c.optimizer_cpu_offload = true;
  c.optimizer_offload_fraction = fraction;
  c.overlap_cpu_optimizer_d2h_h2d = overlap;
  return c;
}

TEST(HostOptimizer, StepsBitForBitAsOnTheDeviceInChunks) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    TrainConfig plain = offload_config(0.0, false);
    plain.optimizer_cpu_offload = false;
    plain.bf16 = dtype == at::kBFloat16;  // bf16: the device keeps its masters as remainders
    const OptimizerRun reference = run_steps(plain, at::kCPU, dtype, 0);
    for (double fraction : {1.0, 0.5}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " fraction " + std::to_string(fraction));
      TrainConfig c = offload_config(fraction, false);
      c.bf16 = plain.bf16;
      // Chunks of 256: several per matrix. ATen's CPU AdamW computes an element alike in a chunk
      // and in the whole tensor when the chunks start on its vector and thread boundaries (the
      // default chunk, 2^25, does); an odd chunk moves elements between its vector and scalar
      // paths, which round differently in the last bit.
      const OptimizerRun offloaded = run_steps(c, at::kCPU, dtype, /*chunk=*/256);
      for (size_t i = 0; i < reference.params.size(); ++i) {
        EXPECT_TRUE(at::equal(offloaded.params[i], reference.params[i])) << "parameter " << i;
      }
      // Megatron's rule over the 4136 elements: whole parameters in order until the fraction is reached.
      std::vector<bool> on_host;
      for (const OptimizerParam& p : offloaded.adamw->params()) {
        on_host.push_back(p.on_host);
        if (!p.on_host) continue;
        EXPECT_TRUE(p.master.is_cpu() && p.exp_avg.is_cpu() && p.exp_avg_sq.is_cpu()) << p.name;
        // bf16 weights: the masters stay remainders, completed by a host copy of the weights.
        EXPECT_EQ(p.host_weights.defined(), dtype == at::kBFloat16) << p.name;
      }
      // Registration order: a.weight (2560), a.bias (40), b.weight (1536); half is 2068 elements.
      EXPECT_EQ(on_host, fraction == 1.0 ? std::vector<bool>({true, true, true}) : std::vector<bool>({true, false, false}));
      // The checkpoint state is the same as the device optimizer's.
      const auto want = reference.adamw->state(), got = offloaded.adamw->state();
      ASSERT_EQ(want.size(), got.size());
      for (size_t k = 0; k < want.size(); ++k) {
        EXPECT_EQ(want[k].name, got[k].name);
        EXPECT_TRUE(at::equal(want[k].tensor, got[k].tensor)) << want[k].name;
      }
      EXPECT_TRUE(at::equal(reference.adamw->params_norm(), offloaded.adamw->params_norm()));
    }
  }
}

TEST(HostOptimizer, TooLittleHostMemoryNamesTheFlags) {
  EXPECT_NO_THROW(check_host_memory(int64_t(8) << 30, int64_t(10) << 30));
  EXPECT_NO_THROW(check_host_memory(int64_t(8) << 30, -1));  // unknown: no check
  try {
    check_host_memory(int64_t(96) << 30, int64_t(64) << 30);
    ADD_FAILURE() << "expected an error";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("needs 96.0 GiB of host memory, and 64.0 GiB is available"), std::string::npos) << what;
    EXPECT_NE(what.find("--optimizer-offload-fraction"), std::string::npos) << what;
  }
  EXPECT_GT(host_memory_available_per_rank(), 0);  // Linux: /proc/meminfo
}

// On CUDA the staging is pinned and, with the overlap, the copies run on their own streams. The
// host's fused AdamW and the device kernel round differently in the last bits, so the weights
// agree within a few ulps; the state sits in host memory.
TEST(HostOptimizerCuda, StepsAsOnTheDeviceWithAndWithoutOverlap) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  TrainConfig plain = offload_config(0.0, false);
  plain.optimizer_cpu_offload = false;
  plain.bf16 = true;
  const OptimizerRun reference = run_steps(plain, at::kCUDA, at::kBFloat16, 0);
  for (bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped" : "serial");
    TrainConfig c = offload_config(1.0, overlap);
    c.bf16 = true;
    const OptimizerRun offloaded = run_steps(c, at::kCUDA, at::kBFloat16, /*chunk=*/100);  // ragged chunks
    for (size_t i = 0; i < reference.params.size(); ++i) {
      const at::Tensor got = offloaded.params[i].to(at::kFloat), want = reference.params[i].to(at::kFloat);
      EXPECT_LE((got - want).abs().max().item<double>(), 1e-2 * want.abs().max().item<double>()) << "parameter " << i;
    }
    for (const OptimizerParam& p : offloaded.adamw->params()) {
      EXPECT_TRUE(p.on_host && p.master.is_cpu() && p.exp_avg.is_cpu() && p.exp_avg_sq.is_cpu()) << p.name;
      EXPECT_TRUE(p.model_slice.is_cuda()) << p.name;
      const at::Tensor master_err = (p.master_fp32() - reference.adamw->params()[&p - &offloaded.adamw->params()[0]].master_fp32().cpu()).abs().max();
      EXPECT_LE(master_err.item<double>(), 1e-5) << p.name;
    }
  }
}

}  // namespace
}  // namespace megatron
