// Each fused CUDA kernel against its ATen composite fallback (kernels::Impl::Composite) on the
// GPU, forward and backward, in fp32 and bf16, at the reference model's sizes. Run on the GPU
// machine by scripts/gpu/run.sh (and bench/gpu_bench.sh's test step); without a CUDA device or
// without the kernels in this build they report a skip, never a pass.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>


#include "kernels/ops.h"
#include "model/gpt_model.h"
#include "model/norm.h"
#include "model/rope.h"
#include "support/model_configs.h"
#include "tensor_parallel/cross_entropy.h"

namespace megatron {
namespace {

#define REQUIRE_CUDA_KERNELS()                                                                        \
  if (!at::hasCUDA() || !kernels::built_with_kernels())                                              \
  GTEST_SKIP() << "needs a CUDA device and a MEGATRON_CUDA build; scripts/gpu/run.sh runs this there"

const at::Device kGpu(at::kCUDA, 0);

// Largest difference relative to the largest magnitude of the reference.
double relative(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
  return ((a64 - b64).abs().max() / b64.abs().max().clamp_min(1e-30)).item<double>();
}

// bf16 holds 8 bits of mantissa: one rounding of an fp32 result differs by up to 2^-8 relative.
double tolerance(at::ScalarType t) { return t == at::kBFloat16 ? 1e-2 : 1e-5; }

class CudaFusedKernels : public ::testing::TestWithParam<at::ScalarType> {};

// RoPE tables for d = 64 over 2048 positions, all channels or half of them rotating.
RopeTables rope_tables_d64(double rotary_percent) {
  ModelConfig c;
  c.kv_channels = 64;
  c.rotary_percent = rotary_percent;
  c.seq_length = 2048;
  return make_rope_tables(c, 2048, kGpu);
}

TEST_P(CudaFusedKernels, RopeForwardAndBackward) {
  REQUIRE_CUDA_KERNELS();
  const at::ScalarType dtype = GetParam();
  for (double rotary_percent : {1.0, 0.5}) {
    const RopeTables tables = rope_tables_d64(rotary_percent);
    for (bool per_sample : {false, true}) {
      const int64_t s = 2048, b = 2, groups = 4, per_group = 8;
      RopeTables t = per_sample ? gather_rope_tables(tables, at::randint(0, 2048, {b, s}, at::TensorOptions(kGpu).dtype(at::kLong)))
                                : tables;
      // k as the attention layer takes it: a strided view of the QKV output [s, b, G, (q + 2) * d].
      at::Tensor qkv = at::randn({s, b, groups, (per_group + 2) * 64}, at::TensorOptions(kGpu).dtype(dtype));
      at::Tensor k = qkv.narrow(-1, per_group * 64, 64);
      at::Tensor y_kernel = kernels::rope(k, t.cos, t.sin);
      at::Tensor y_composite = kernels::rope(k, t.cos, t.sin, kernels::Impl::Composite);
      EXPECT_LE(relative(y_kernel, y_composite), tolerance(dtype)) << "forward, rotary " << rotary_percent;

      at::Tensor x1 = k.detach().clone().requires_grad_(true), x2 = k.detach().clone().requires_grad_(true);
      at::Tensor grad = at::randn_like(y_kernel);
      kernels::rope(x1, t.cos, t.sin).backward(grad);
      kernels::rope(x2, t.cos, t.sin, kernels::Impl::Composite).backward(grad);
      EXPECT_LE(relative(x1.grad(), x2.grad()), tolerance(dtype)) << "backward, rotary " << rotary_percent;

      // q read in place: [s, b, G, H/G, d] with the groups a QKV row apart.
      at::Tensor q = qkv.narrow(-1, 0, per_group * 64).view({s, b, groups, per_group, 64});
      at::Tensor q_kernel = kernels::rope(q, t.cos, t.sin);
      at::Tensor q_composite =
          kernels::rope(q.reshape({s, b, groups * per_group, 64}), t.cos, t.sin, kernels::Impl::Composite);
      EXPECT_LE(relative(q_kernel, q_composite), tolerance(dtype)) << "grouped queries, rotary " << rotary_percent;
    }
  }
}

// The attention layer's fused split: the kernel writes each rotated gradient straight into its
// strided place of the QKV output's gradient (packed path at d 64, element path at partial rotary).
TEST_P(CudaFusedKernels, SplitQkvRopeForwardAndBackward) {
  REQUIRE_CUDA_KERNELS();
  const at::ScalarType dtype = GetParam();
  for (double rotary_percent : {1.0, 0.5}) {
    const RopeTables t = rope_tables_d64(rotary_percent);
    const int64_t s = 2048, b = 2, groups = 4, per_group = 8;
    const at::Tensor qkv = at::randn({s, b, groups, (per_group + 2) * 64}, at::TensorOptions(kGpu).dtype(dtype));
    at::Tensor x1 = qkv.clone().requires_grad_(true), x2 = qkv.clone().requires_grad_(true);
    const kernels::QkvRope kernel = kernels::split_qkv_rope(x1, per_group, t.cos, t.sin);
    const kernels::QkvRope composite = kernels::split_qkv_rope(x2, per_group, t.cos, t.sin, kernels::Impl::Composite);
    EXPECT_LE(relative(kernel.q, composite.q), tolerance(dtype)) << "q, rotary " << rotary_percent;
    EXPECT_LE(relative(kernel.k, composite.k), tolerance(dtype)) << "k, rotary " << rotary_percent;
    EXPECT_TRUE(at::equal(kernel.v, composite.v));
    const at::Tensor dq = at::randn_like(kernel.q), dk = at::randn_like(kernel.k), dv = at::randn_like(kernel.v);
    torch::autograd::backward({kernel.q, kernel.k, kernel.v}, {dq, dk, dv});
    torch::autograd::backward({composite.q, composite.k, composite.v}, {dq, dk, dv});
    EXPECT_LE(relative(x1.grad(), x2.grad()), tolerance(dtype)) << "backward, rotary " << rotary_percent;
    // And against the unfused split: kernels::rope on the views, whose gradients autograd concatenates.
    at::Tensor x3 = qkv.clone().requires_grad_(true);
    auto parts = x3.split_with_sizes({per_group * 64, 64, 64}, -1);
    const at::Tensor q = kernels::rope(parts[0].view({s, b, groups, per_group, 64}), t.cos, t.sin);
    const at::Tensor k = kernels::rope(parts[1], t.cos, t.sin);
    EXPECT_TRUE(at::equal(kernel.q, q) && at::equal(kernel.k, k)) << "the same kernel, the same values";
    torch::autograd::backward({q, k, parts[2]}, {dq, dk, dv});
    EXPECT_TRUE(at::equal(x1.grad(), x3.grad())) << "rotary " << rotary_percent;
  }
}

TEST_P(CudaFusedKernels, SwigluForwardAndBackward) {
  REQUIRE_CUDA_KERNELS();
  const at::ScalarType dtype = GetParam();
  for (int64_t f : {5632, 1000, 1001, 24}) {  // reference shape, packed rows, unaligned rows (element path), tiny
    at::Tensor h = (2 * at::randn({1024, 2 * f}, at::TensorOptions(kGpu).dtype(dtype)));
    at::Tensor y_kernel = kernels::swiglu(h), y_composite = kernels::swiglu(h, kernels::Impl::Composite);
    EXPECT_LE(relative(y_kernel, y_composite), tolerance(dtype)) << "forward, f " << f;
    at::Tensor h1 = h.clone().requires_grad_(true), h2 = h.clone().requires_grad_(true);
    at::Tensor grad = at::randn_like(y_kernel);
    kernels::swiglu(h1).backward(grad);
    kernels::swiglu(h2, kernels::Impl::Composite).backward(grad);
    EXPECT_LE(relative(h1.grad(), h2.grad()), tolerance(dtype)) << "backward, f " << f;
  }
}

// Greedy decoding's argmax against ATen's on the same rows: one row of a 32000-id vocabulary (a
// batch-1 decode step) and 64 of them, rows in 16-byte packs and not (n 1001; a view starting off
// a pack; rows 1001 apart), ties to the lower index, NaN above every number (the first one), a row
// of -inf and one with +inf twice.
TEST_P(CudaFusedKernels, ArgmaxRowsEqualsAtenArgmax) {
  REQUIRE_CUDA_KERNELS();
  const at::ScalarType dtype = GetParam();
  const at::TensorOptions o = at::TensorOptions(kGpu).dtype(dtype);
  at::manual_seed(11);
  std::vector<std::pair<std::string, at::Tensor>> cases = {
      {"1 x 32000", at::randn({1, 32000}, o)},
      {"64 x 32000", at::randn({64, 32000}, o)},
      {"3 x 1001", at::randn({3, 1001}, o)},
      {"a view off the pack", at::randn({5, 32128}, o).narrow(1, 3, 32000)},
      {"rows 1001 apart", at::randn({4, 1001}, o).narrow(1, 0, 1000)},
  };
  at::Tensor planted = at::randn({6, 4096}, o);
  planted[0].index_put_({at::indexing::Slice(100, 4096, 700)}, 9.0);  // equal maxima at 100, 800, ...: the first
  planted[1][2000] = NAN;
  planted[1][77] = NAN;  // two NaNs: the first
  planted[1][3000] = INFINITY;
  planted[2].fill_(-INFINITY);  // every value equal: index 0
  planted[3][4095] = INFINITY;
  planted[3][9] = INFINITY;
  planted[4][4095] = 50.0;  // the last element
  planted[5][0] = 50.0;     // the first
  cases.emplace_back("planted", planted);
  for (const auto& [name, x] : cases) {
    const at::Tensor got = kernels::argmax_rows(x), want = x.argmax(-1);
    ASSERT_EQ(got.scalar_type(), at::kLong) << name;
    EXPECT_TRUE(at::equal(got, want)) << name << ": " << got.cpu() << " against ATen's " << want.cpu();
  }
  const at::Tensor chosen = kernels::argmax_rows(planted).cpu();
  EXPECT_EQ(std::vector<int64_t>(chosen.data_ptr<int64_t>(), chosen.data_ptr<int64_t>() + 6), (std::vector<int64_t>{100, 77, 0, 9, 4095, 0}));
}

TEST_P(CudaFusedKernels, CrossEntropyStatsAndBackward) {
  REQUIRE_CUDA_KERNELS();
  const at::ScalarType dtype = GetParam();
  auto on_gpu = at::TensorOptions(kGpu);
  for (int64_t vocab : {32000, 1000, 1001, 7}) {  // packed rows; 1001: unaligned rows (element path)
    const int64_t rows = 2048, first = vocab;  // this rank holds ids [vocab, 2 * vocab)
    at::Tensor logits = (5 * at::randn({rows, vocab}, on_gpu)).to(dtype);
    at::Tensor targets = at::randint(0, 3 * vocab, {rows}, on_gpu.dtype(at::kLong));  // a third in the slice
    auto k = kernels::cross_entropy_stats(logits, targets, first);
    auto c = kernels::cross_entropy_stats(logits, targets, first, kernels::Impl::Composite);
    EXPECT_LE(relative(k.max, c.max), 1e-6) << vocab;          // exact: a max of the same values
    EXPECT_LE(relative(k.sum_exp, c.sum_exp), 1e-5) << vocab;  // fp32 sums in another order
    EXPECT_LE(relative(k.target_logit, c.target_logit), 1e-6) << vocab;
    at::Tensor grad_loss = at::rand({rows}, on_gpu);
    at::Tensor g_kernel = kernels::cross_entropy_backward(logits, targets, c.max, c.sum_exp, grad_loss, first);
    at::Tensor g_composite =
        kernels::cross_entropy_backward(logits, targets, c.max, c.sum_exp, grad_loss, first, kernels::Impl::Composite);
    EXPECT_LE(relative(g_kernel, g_composite), tolerance(dtype)) << vocab;
  }
}

TEST_P(CudaFusedKernels, CrossEntropyLossMatchesAtenInFp32) {
  REQUIRE_CUDA_KERNELS();
  const at::ScalarType dtype = GetParam();
  at::Tensor logits = (3 * at::randn({512, 4, 32000}, at::TensorOptions(kGpu))).to(dtype);
  at::Tensor targets = at::randint(0, 32000, {512, 4}, at::TensorOptions(kGpu).dtype(at::kLong));
  at::Tensor a = logits.clone().requires_grad_(true), b = logits.clone().requires_grad_(true);
  at::Tensor fused = tp::fused_vocab_parallel_cross_entropy(a, targets, dist::Group());
  at::Tensor plain = at::cross_entropy_loss(b.to(at::kFloat).view({-1, 32000}), targets.view({-1}), {},
                                            at::Reduction::None).view({512, 4});
  EXPECT_LE(relative(fused, plain), 1e-5);
  at::Tensor grad = at::rand({512, 4}, at::TensorOptions(kGpu));
  fused.backward(grad);
  plain.backward(grad);
  EXPECT_LE(relative(a.grad(), b.grad()), tolerance(dtype));
}

TEST_P(CudaFusedKernels, RmsNormKernelMatchesAtenAndFp64) {
  // kernels::rms_norm (kernels/rmsnorm.cu) against its fallback, ATen's rms_norm, and an fp64
  // reference; h = 2048 takes the kernel, h = 1000 (not a whole number of packs) the fallback.
  REQUIRE_CUDA_KERNELS();
  const at::ScalarType dtype = GetParam();
  for (int64_t h : {2048, 1000}) {
    at::Tensor x = at::randn({1024, 3, h}, at::TensorOptions(kGpu).dtype(dtype));
    at::Tensor w = (1 + 0.1 * at::randn({h}, at::TensorOptions(kGpu))).to(dtype);
    at::Tensor x1 = x.clone().requires_grad_(true), w1 = w.clone().requires_grad_(true);
    at::Tensor x2 = x.clone().requires_grad_(true), w2 = w.clone().requires_grad_(true);
    at::Tensor x3 = x.to(at::kDouble).requires_grad_(true), w3 = w.to(at::kDouble).requires_grad_(true);
    at::Tensor fused = kernels::rms_norm(x1, w1, 1e-5);
    at::Tensor aten = kernels::rms_norm(x2, w2, 1e-5, kernels::Impl::Composite);
    at::Tensor reference = x3 * at::rsqrt(x3.pow(2).mean(-1, true) + 1e-5) * w3;
    EXPECT_LE(relative(fused, aten), tolerance(dtype)) << "h " << h;
    EXPECT_LE(relative(fused, reference), tolerance(dtype)) << "h " << h;
    at::Tensor grad = at::randn_like(fused);
    fused.backward(grad);
    aten.backward(grad);
    reference.backward(grad.to(at::kDouble));
    EXPECT_LE(relative(x1.grad(), x2.grad()), 2 * tolerance(dtype)) << "h " << h;
    EXPECT_LE(relative(x1.grad(), x3.grad()), 2 * tolerance(dtype)) << "h " << h;
    // The weight gradient sums 3072 rows: bf16 rounds only the final sum.
    EXPECT_LE(relative(w1.grad(), w3.grad()), 2 * tolerance(dtype)) << "h " << h;
    EXPECT_LE(relative(w1.grad(), w2.grad()), 2 * tolerance(dtype)) << "h " << h;
  }
}

TEST_P(CudaFusedKernels, AddRmsNormMatchesAddThenRmsNorm) {
  REQUIRE_CUDA_KERNELS();
  const at::ScalarType dtype = GetParam();
  auto options = at::TensorOptions(kGpu).dtype(dtype);
  at::Tensor a = at::randn({1024, 3, 2048}, options), b = at::randn({1024, 3, 2048}, options);
  at::Tensor w = (1 + 0.1 * at::randn({2048}, at::TensorOptions(kGpu))).to(dtype);
  std::vector<at::Tensor> in1 = {a.clone().requires_grad_(true), b.clone().requires_grad_(true), w.clone().requires_grad_(true)};
  std::vector<at::Tensor> in2 = {a.clone().requires_grad_(true), b.clone().requires_grad_(true), w.clone().requires_grad_(true)};
  const kernels::AddRmsNorm fused = kernels::add_rms_norm(in1[0], in1[1], in1[2], 1e-5);
  const kernels::AddRmsNorm plain = kernels::add_rms_norm(in2[0], in2[1], in2[2], 1e-5, kernels::Impl::Composite);
  EXPECT_TRUE(at::equal(fused.sum, plain.sum)) << "the residual sum is the plain add, rounded the same way";
  EXPECT_LE(relative(fused.normed, plain.normed), tolerance(dtype));
  // --recompute-modules layernorm makes the fused kernel's normed output again as the RMSNorm
  // kernel of the kept sum: bit for bit.
  {
    at::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(kernels::rms_norm(fused.sum, w, 1e-5), fused.normed));
  }
  // Both outputs carry gradient, as in the layer (the sum continues down the residual stream).
  at::Tensor grad_sum = at::randn_like(fused.sum), grad_normed = at::randn_like(fused.normed);
  torch::autograd::backward({fused.sum, fused.normed}, {grad_sum, grad_normed});
  torch::autograd::backward({plain.sum, plain.normed}, {grad_sum, grad_normed});
  for (int i = 0; i < 3; ++i) EXPECT_LE(relative(in1[i].grad(), in2[i].grad()), 2 * tolerance(dtype)) << "input " << i;
}

TEST_P(CudaFusedKernels, AdamWMatchesAtenFusedAdamWThenCopy) {
  // GetParam() is the model weights' dtype: bf16 (a separate copy written by the kernel) or fp32
  // (the master is the model's own tensor).
  REQUIRE_CUDA_KERNELS();
  const at::ScalarType dtype = GetParam();
  auto f32 = at::TensorOptions(kGpu).dtype(at::kFloat);
  for (int64_t n : {int64_t(1) << 20, (int64_t(1) << 20) + 3}) {  // packed, and the one-element path
    at::Tensor master = at::randn({n}, f32), m = 0.01 * at::randn({n}, f32), v = 0.01 * at::rand({n}, f32);
    std::vector<at::Tensor> kernel = {master.clone(), m.clone(), v.clone()}, fallback = {master.clone(), m.clone(), v.clone()};
    at::Tensor model_kernel = dtype == at::kFloat ? kernel[0] : master.to(dtype);
    at::Tensor model_fallback = dtype == at::kFloat ? fallback[0] : master.to(dtype);
    at::Tensor step = at::zeros({}, f32);
    for (int64_t k = 1; k <= 4; ++k) {
      at::Tensor grad = at::randn({n}, f32);
      const at::Tensor scale = at::full({}, k == 2 ? 7.5 : 1.0, f32);  // step 2 is clipped
      const at::Tensor found_inf = at::full({}, k == 3 ? 1.0 : 0.0, f32);  // step 3 is skipped
      if (k != 3) step.add_(1);
      // A learning rate that changes every step: the kernel must read it from the device.
      const at::Tensor lr = at::full({}, 1e-3 * double(k), f32.dtype(at::kDouble));
      const kernels::AdamWStepScalars scalars = kernels::adamw_step_scalars(step, scale, found_inf, lr, 0.9, 0.95);
      const kernels::AdamWHyperparameters h{0.9, 0.95, 1e-8, k == 4 ? 0.0 : 0.1};
      const at::Tensor before = kernel[0].clone();
      kernels::adamw_step(kernel[0], kernel[1], kernel[2], grad, model_kernel, h, scalars);
      kernels::adamw_step(fallback[0], fallback[1], fallback[2], grad, model_fallback, h, scalars,
                          kernels::Impl::Composite);
      if (k == 3) EXPECT_TRUE(at::equal(kernel[0], before)) << "found_inf must leave the master as it was";
    }
    for (int i = 0; i < 3; ++i) EXPECT_LE(relative(kernel[i], fallback[i]), 1e-5) << "state " << i << ", n " << n;
    EXPECT_GT(relative(kernel[0], master), 1e-4);  // it moved
    EXPECT_TRUE(at::equal(model_kernel, kernel[0].to(dtype))) << "the model copy is the master rounded once";
    EXPECT_LE(relative(model_kernel, model_fallback), tolerance(dtype));
  }
}

// --grad-reduce-in-bf16: the kernel reads bf16 gradients (packed and one element at a time) as
// the fallback reads them upcast.
TEST(CudaFusedKernelsBf16Gradients, AdamWMatchesAtenOnUpcastGradients) {
  REQUIRE_CUDA_KERNELS();
  auto f32 = at::TensorOptions(kGpu).dtype(at::kFloat);
  for (int64_t n : {int64_t(1) << 20, (int64_t(1) << 20) + 3}) {
    at::Tensor master = at::randn({n}, f32), m = 0.01 * at::randn({n}, f32), v = 0.01 * at::rand({n}, f32);
    std::vector<at::Tensor> kernel = {master.clone(), m.clone(), v.clone()}, fallback = {master.clone(), m.clone(), v.clone()};
    at::Tensor model_kernel = master.to(at::kBFloat16), model_fallback = master.to(at::kBFloat16);
    at::Tensor step = at::zeros({}, f32);
    for (int64_t k = 1; k <= 3; ++k) {
      const at::Tensor grad = at::randn({n}, f32).to(at::kBFloat16);
      step.add_(1);
      const kernels::AdamWStepScalars scalars =
          kernels::adamw_step_scalars(step, at::full({}, 2.0, f32), at::zeros({}, f32), at::full({}, 1e-3, f32.dtype(at::kDouble)), 0.9, 0.95);
      const kernels::AdamWHyperparameters h{0.9, 0.95, 1e-8, 0.1};
      kernels::adamw_step(kernel[0], kernel[1], kernel[2], grad, model_kernel, h, scalars);
      kernels::adamw_step(fallback[0], fallback[1], fallback[2], grad, model_fallback, h, scalars, kernels::Impl::Composite);
    }
    for (int i = 0; i < 3; ++i) EXPECT_LE(relative(kernel[i], fallback[i]), 1e-5) << "state " << i << ", n " << n;
    EXPECT_GT(relative(kernel[0], master), 1e-4);  // it moved
  }
}

// --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16: the kernel reads
// bf16 moments (packed and one element at a time; one moment bf16 and the other fp32 too), steps
// them in fp32 and rounds them once to nearest. Each applied step's stored moments are compared
// with the update computed in fp64 from the same stored inputs and rounded once (fp32 arithmetic
// may land on the other side of a rounding midpoint for a few elements), for the kernel and for
// the fallback alike; the master weights with the fallback's.
TEST(CudaFusedKernelsBf16Moments, AdamWRoundsTheFp32UpdateOnce) {
  REQUIRE_CUDA_KERNELS();
  auto f32 = at::TensorOptions(kGpu).dtype(at::kFloat);
  const double beta1 = 0.9, beta2 = 0.95, scale = 1.5;
  // bf16: the share of elements whose stored moment differs from the rounded fp64 update; fp32
  // (kept beside a bf16 one): the relative difference, fp32 arithmetic against fp64.
  auto off = [](const at::Tensor& stored, const at::Tensor& exact) {
    if (stored.scalar_type() == at::kFloat) return relative(stored, exact.to(at::kFloat));
    return stored.ne(exact.to(at::kFloat).to(stored.scalar_type())).to(at::kDouble).mean().item<double>();
  };
  for (const auto& [m_dtype, v_dtype] : {std::pair{at::kBFloat16, at::kBFloat16}, std::pair{at::kBFloat16, at::kFloat}}) {
    for (int64_t n : {int64_t(1) << 20, (int64_t(1) << 20) + 3}) {
      at::Tensor master = at::randn({n}, f32);
      at::Tensor m = (0.01 * at::randn({n}, f32)).to(m_dtype), v = (1e-4 * at::rand({n}, f32)).to(v_dtype);
      std::vector<at::Tensor> kernel = {master.clone(), m.clone(), v.clone()}, fallback = {master.clone(), m.clone(), v.clone()};
      at::Tensor model_kernel = master.to(at::kBFloat16), model_fallback = master.to(at::kBFloat16);
      at::Tensor step = at::zeros({}, f32);
      for (int64_t k = 1; k <= 3; ++k) {
        const at::Tensor grad = 0.01 * at::randn({n}, f32);
        const at::Tensor found_inf = at::full({}, k == 2 ? 1.0 : 0.0, f32);  // step 2 is skipped
        if (k != 2) step.add_(1);
        const kernels::AdamWStepScalars scalars =
            kernels::adamw_step_scalars(step, at::full({}, scale, f32), found_inf, at::full({}, 1e-3, f32.dtype(at::kDouble)), beta1, beta2);
        const kernels::AdamWHyperparameters h{beta1, beta2, 1e-8, 0.1};
        const at::Tensor g = grad.to(at::kDouble) / scale;
        auto exact = [&](const std::vector<at::Tensor>& state) {
          return std::pair{beta1 * state[1].to(at::kDouble) + (1 - beta1) * g, beta2 * state[2].to(at::kDouble) + (1 - beta2) * g * g};
        };
        const auto [m_kernel, v_kernel] = exact(kernel);
        const auto [m_fallback, v_fallback] = exact(fallback);
        const at::Tensor before = kernel[1].clone();
        kernels::adamw_step(kernel[0], kernel[1], kernel[2], grad, model_kernel, h, scalars);
        kernels::adamw_step(fallback[0], fallback[1], fallback[2], grad, model_fallback, h, scalars, kernels::Impl::Composite);
        if (k == 2) {
          EXPECT_TRUE(at::equal(kernel[1], before)) << "found_inf must leave the moments as they were";
          continue;
        }
        const double kernel_off[] = {off(kernel[1], m_kernel), off(kernel[2], v_kernel)};
        const double fallback_off[] = {off(fallback[1], m_fallback), off(fallback[2], v_fallback)};
        std::printf("bf16 moments, step %lld, n %lld: off the rounded fp64 update: kernel %.2e / %.2e, fallback %.2e / %.2e\n",
                    static_cast<long long>(k), static_cast<long long>(n), kernel_off[0], kernel_off[1], fallback_off[0], fallback_off[1]);
        for (int i = 0; i < 2; ++i) {
          EXPECT_LE(kernel_off[i], 1e-3) << "kernel, moment " << i + 1 << ", step " << k << ", n " << n;
          EXPECT_LE(fallback_off[i], 1e-3) << "fallback, moment " << i + 1 << ", step " << k << ", n " << n;
        }
      }
      EXPECT_EQ(kernel[1].scalar_type(), m_dtype);
      EXPECT_EQ(kernel[2].scalar_type(), v_dtype);
      EXPECT_LE(relative(kernel[0], fallback[0]), 2e-5) << "n " << n;  // the master moved by ~1e-3 of itself
      EXPECT_GT(relative(kernel[0], master), 1e-4);  // it moved
    }
  }
}

// The precision-aware optimizer's masters of bf16 weights as int16 remainders (Megatron's
// store_param_remainders): the kernel joins weight and remainder into the fp32 master, steps it
// and splits it again, as the fallback does through join_master / split_master; and the pair is
// the fp32 master exactly (a master stepped alongside in fp32 agrees to the bit but where the
// two paths' fp32 arithmetic differs).
TEST(CudaFusedKernelsRemainders, AdamWStepsTheJoinedMaster) {
  REQUIRE_CUDA_KERNELS();
  at::manual_seed(17);
  auto f32 = at::TensorOptions(kGpu).dtype(at::kFloat);
  for (int64_t n : {int64_t(1) << 20, (int64_t(1) << 20) + 3}) {
    const at::Tensor master = at::randn({n}, f32);
    at::Tensor model_kernel = at::empty({n}, f32.dtype(at::kBFloat16)), model_fallback = at::empty_like(model_kernel);
    at::Tensor rest_kernel = at::empty({n}, f32.dtype(at::kShort)), rest_fallback = at::empty_like(rest_kernel);
    kernels::split_master(master, model_kernel, rest_kernel);
    kernels::split_master(master, model_fallback, rest_fallback);
    ASSERT_TRUE(at::equal(kernels::join_master(model_kernel, rest_kernel), master)) << "the pair is the fp32 value";
    EXPECT_LE(relative(model_kernel.to(at::kFloat), master), 4e-3);
    std::vector<at::Tensor> kernel = {at::zeros({n}, f32.dtype(at::kBFloat16)), at::zeros({n}, f32.dtype(at::kBFloat16))};
    std::vector<at::Tensor> fallback = {kernel[0].clone(), kernel[1].clone()};
    at::Tensor step = at::zeros({}, f32);
    for (int64_t k = 1; k <= 3; ++k) {
      const at::Tensor grad = 0.01 * at::randn({n}, f32);
      step.add_(1);
      const kernels::AdamWStepScalars scalars =
          kernels::adamw_step_scalars(step, at::ones({}, f32), at::zeros({}, f32), at::full({}, 1e-3, f32.dtype(at::kDouble)), 0.9, 0.95);
      const kernels::AdamWHyperparameters h{0.9, 0.95, 1e-8, 0.1};
      kernels::adamw_step(rest_kernel, kernel[0], kernel[1], grad, model_kernel, h, scalars);
      kernels::adamw_step(rest_fallback, fallback[0], fallback[1], grad, model_fallback, h, scalars, kernels::Impl::Composite);
    }
    const at::Tensor joined_kernel = kernels::join_master(model_kernel, rest_kernel);
    const at::Tensor joined_fallback = kernels::join_master(model_fallback, rest_fallback);
    // bf16 moments: where the two fp32 moments differ in the last bit, one may round to the
    // neighbouring bf16 value (one part in 256 of that element's update); 1.06e-6 was seen.
    EXPECT_LE(relative(joined_kernel, joined_fallback), 3e-6) << "n " << n;
    EXPECT_GT(relative(joined_kernel, master), 1e-4) << "it moved";
    EXPECT_LE(model_kernel.ne(model_fallback).to(at::kDouble).mean().item<double>(), 1e-3) << "n " << n;
  }
}

// A gradient upcast into its fp32 accumulator, overwriting and adding: exactly ATen's copy_ and
// add_ (an exact upcast, one fp32 add), at a length with a tail past the last pack, and at offsets
// that allow packs of 8, of 4 and of 1 (parameters sit at any offset of the flat buffers).
TEST_P(CudaFusedKernels, AccumulateGradIsCopyAndAdd) {
  REQUIRE_CUDA_KERNELS();
  const at::ScalarType dtype = GetParam();
  const int64_t n = 1000003;
  for (int64_t offset : {0, 4, 1}) {
    const at::Tensor src = at::randn({n + 8}, at::TensorOptions(kGpu).dtype(dtype)).narrow(0, offset, n);
    const at::Tensor start = at::randn({n + 8}, at::TensorOptions(kGpu));
    for (bool overwrite : {true, false}) {
      at::Tensor kernel = start.clone(), composite = start.clone();
      kernels::accumulate_grad(kernel.narrow(0, offset, n), src, overwrite);
      kernels::accumulate_grad(composite.narrow(0, offset, n), src, overwrite, kernels::Impl::Composite);
      EXPECT_TRUE(at::equal(kernel, composite)) << "offset " << offset << (overwrite ? " overwrite" : " add");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaFusedKernels, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

ModelConfig small_llama(bool fused) {
  ModelConfig c = test::small_llama({256, 8, 2, 704, 256, 2048});
  c.apply_rope_fusion = c.bias_swiglu_fusion = c.cross_entropy_loss_fusion = c.bias_dropout_fusion = fused;
  return c;
}

TEST(CudaFusedModel, Bf16GradientsMatchTheUnfusedModel) {
  REQUIRE_CUDA_KERNELS();
  GPTModel fused(small_llama(true)), plain(small_llama(false));
  fused.initialize(7);
  plain.initialize(7);
  fused.to(kGpu, at::kBFloat16);
  plain.to(kGpu, at::kBFloat16);
  auto on_gpu = at::TensorOptions(kGpu).dtype(at::kLong);
  Batch batch{at::randint(0, 2048, {4, 256}, on_gpu), at::randint(0, 2048, {4, 256}, on_gpu),
              at::ones({4, 256}, at::TensorOptions(kGpu))};
  at::Tensor loss_fused = fused.loss(batch), loss_plain = plain.loss(batch);
  EXPECT_NEAR(loss_fused.item<double>(), loss_plain.item<double>(), 1e-2 * loss_plain.item<double>());
  loss_fused.backward();
  loss_plain.backward();
  auto pf = fused.named_parameters(), pp = plain.named_parameters();
  for (size_t i = 0; i < pf.size(); ++i) {
    // Whole-tensor relative L2 difference: bf16 noise, not a formula error, stays ~1e-2.
    at::Tensor a = pf[i].value().grad().to(at::kDouble), b = pp[i].value().grad().to(at::kDouble);
    EXPECT_LE(((a - b).norm() / b.norm()).item<double>(), 3e-2) << pf[i].key();
  }
}

}  // namespace
}  // namespace megatron
