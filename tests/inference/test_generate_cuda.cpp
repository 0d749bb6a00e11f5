// Generation on the GPU (run by scripts/gpu/run.sh; without a CUDA device these tests report a
// skip, never a pass). With attention reading the key/value cache where it lies (flash
// attention's variable-length kernel, SdpaAttention::forward_over_cache), every cached step's
// logits against a full forward of the same model over the whole sequence and against the
// gathered cache, with sequences of different lengths in slots given out of order and a step of
// several new tokens; and the engine's decode steps replayed from CUDA graphs against eager steps.
// The decode step's QKV split into the cache against the split then the write, and
// the one-row linear layer (batch-1 decode) against the fp32 product.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_device.h"
#include "inference/engine.h"
#include "inference/generation_model.h"
#include "kernels/attention_ops.h"
#include "kernels/gemv_ops.h"
#include "kernels/ops.h"
#include "model/core_attention.h"
#include "model/gpt_model.h"
#include "model/kv_cache.h"
#include "support/hf_fixtures.h"
#include "support/test_support.h"

namespace megatron {
namespace {

using Ids = std::vector<int64_t>;

Ids prompt_of(int64_t length, int64_t start, int64_t vocab) {
  Ids p;
  for (int64_t i = 0; i < length; ++i) p.push_back((start + 37 * i) % vocab);
  return p;
}

// Rounding alone (fp16, a few layers) stays well below this; a sequence that sees one wrong key
// goes well above it (checked below on the fixture itself).
constexpr double kTolerance = 5e-3;

// max |a - b| over the last position's logits, relative to the largest logit.
double relative_gap(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kFloat), y = b.to(at::kFloat);
  return (x - y).abs().max().item<double>() / y.abs().max().item<double>();
}

class GenerationCuda : public ::testing::TestWithParam<std::string> {};

// The decode step's one-pass QKV split against split_qkv_rope (the training path) followed by
// writing the keys and values into the cache rows: the same bits, rows given out of order.
TEST(GenerationCudaKernels, QkvRopeIntoCacheEqualsSplitThenWrite) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(8);
  const int64_t s = 2, b = 3, groups = 2, per_group = 4, d = 64, rows = 40;
  const at::Device gpu(at::kCUDA, 0);
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const at::TensorOptions o = at::TensorOptions().device(gpu).dtype(dtype);
    const at::Tensor qkv = at::randn({s, b, groups, (per_group + 2) * d}, o);
    const at::Tensor angles = at::rand({s, b, 1, d}, o.dtype(at::kFloat)) * 6.0;
    const at::Tensor cos = angles.cos(), sin = angles.sin();
    const at::Tensor store_rows = at::tensor(std::vector<int64_t>{31, 7, 0, 12, 39, 5}, at::kLong).to(gpu);  // [b s], sequence-major
    ASSERT_TRUE(kernels::qkv_rope_into_cache_takes(qkv, d, cos));
    const at::Tensor k_store = at::zeros({rows, groups, d}, o), v_store = at::zeros({rows, groups, d}, o);
    const at::Tensor q = kernels::qkv_rope_into_cache(qkv, per_group, cos, sin, k_store, v_store, store_rows);
    const kernels::QkvRope want = kernels::split_qkv_rope(qkv, per_group, cos, sin);
    EXPECT_TRUE(at::equal(q, want.q)) << dtype;
    const at::Tensor order = store_rows.view({b, s}).t().reshape({s * b});  // token (si, bi)'s row, s-major like want's [s, b]
    EXPECT_TRUE(at::equal(k_store.index_select(0, order), want.k.reshape({s * b, groups, d}))) << dtype;
    EXPECT_TRUE(at::equal(v_store.index_select(0, order), want.v.reshape({s * b, groups, d}))) << dtype;
    const at::Tensor untouched = at::ones({rows}, o.dtype(at::kBool)).index_fill_(0, store_rows, false);
    EXPECT_EQ(k_store.index({untouched}).abs().max().item<double>(), 0.0) << dtype;
  }
}

// The one-launch decode attention against fp32 attention over each sequence's rows: bf16 and fp16,
// heads of 64 and 128 channels, 8, 7 (rounded up to 8 inside), 3 and 1 query heads a KV group,
// sequences of 1 to 2100 keys in slots out of order (one split, several, the most), the grid
// sized for the cache's capacity (a decode graph) and for the longest sequence (an eager step);
// twice in a row (the tickets come back zero) with the same bits; and what it refuses.
TEST(GenerationCudaKernels, DecodeAttentionEqualsTheFp32Attention) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(9);
  const at::Device gpu(at::kCUDA, 0);
  const int64_t slots = 4, capacity = 2100;
  const std::vector<int64_t> sequence_slots = {2, 0, 3};
  const int64_t b = static_cast<int64_t>(sequence_slots.size());
  std::vector<int32_t> starts;
  for (int64_t slot : sequence_slots) starts.push_back(static_cast<int32_t>(slot * capacity));
  const at::Tensor key_starts = at::tensor(starts, at::kInt).to(gpu);
  struct Heads {
    int64_t heads, groups, d;
  };
  // The grid for the cache's capacity (a decode graph: 16 splits merged through global memory, of
  // which the sequences use 1, 3 and 16), for a bound of 512 keys (8 splits of 64 keys as one
  // thread-block cluster on sm_90, of which the sequences use 1, 5 and 8: blocks past the keys
  // share the merge), and for the longest of short sequences (an eager step: on sm_90 a cluster of
  // 2 splits, of which the sequences use 1, 2 and 2; else one split, no merge).
  struct Lengths {
    int64_t longest;
    std::vector<int32_t> counts;
  };
  const bool hopper = cuda_compute_capability_major(gpu) >= 9;
  EXPECT_EQ(kernels::decode_attention_merges_in_cluster(512, b, 4), hopper) << "the cluster merge is what runs up to 512 keys on sm_90";
  EXPECT_FALSE(kernels::decode_attention_merges_in_cluster(513, 1, 4));
  EXPECT_FALSE(kernels::decode_attention_merges_in_cluster(512, 16, 4)) << "512 blocks: more than one wave";
  for (const Lengths& lengths : {Lengths{capacity, {1, 300, 2100}}, Lengths{512, {1, 300, 512}}, Lengths{128, {1, 77, 128}}}) {
    const at::Tensor key_counts = at::tensor(lengths.counts, at::kInt).to(gpu);
    for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
      const double tolerance = dtype == at::kBFloat16 ? 8e-3 : 1.5e-3;
      for (const Heads& h : {Heads{32, 4, 64}, Heads{14, 2, 64}, Heads{12, 4, 128}, Heads{8, 8, 128}}) {
        const at::TensorOptions o = at::TensorOptions().device(gpu).dtype(dtype);
        const at::Tensor k_store = at::randn({slots * capacity, h.groups, h.d}, o);  // [rows, G, d]
        const at::Tensor v_store = at::randn({slots * capacity, h.groups, h.d}, o);
        const at::Tensor q = at::randn({b, h.heads, h.d}, o);  // [b, H, d]
        const double scale = 1.0 / std::sqrt(double(h.d));
        ASSERT_TRUE(kernels::decode_attention_takes(q, k_store, v_store)) << h.heads << " heads of " << h.d;
        const at::Tensor tickets = at::zeros({kernels::decode_attention_tickets(b, h.groups)}, o.dtype(at::kInt));
        const at::Tensor out = kernels::decode_attention(q, k_store, v_store, key_starts, key_counts, lengths.longest, scale, tickets);
        const at::Tensor again = kernels::decode_attention(q, k_store, v_store, key_starts, key_counts, lengths.longest, scale, tickets);
        EXPECT_TRUE(at::equal(out, again)) << "the same bits twice";
        EXPECT_EQ(tickets.abs().sum().item<int64_t>(), 0) << "the tickets are left zero";
        for (int64_t i = 0; i < b; ++i) {
          const int64_t start = starts[size_t(i)], n = lengths.counts[size_t(i)], per_group = h.heads / h.groups;
          auto rows = [&](const at::Tensor& store, int64_t count) {  // [count, H, d] fp32, each group's rows for its heads
            return store.narrow(0, start, count).to(at::kFloat).repeat_interleave(per_group, 1);
          };
          auto attention = [&](int64_t count) {  // [H, d]
            const at::Tensor scores = at::einsum("hd,nhd->hn", {q[i].to(at::kFloat), rows(k_store, count)}) * scale;
            return at::einsum("hn,nhd->hd", {scores.softmax(-1), rows(v_store, count)});
          };
          const at::Tensor want = attention(n);
          const double gap = (out[i].to(at::kFloat) - want).abs().max().item<double>();
          EXPECT_LE(gap, tolerance) << dtype << ", " << h.heads << " heads in " << h.groups << " groups of " << h.d << ", sequence " << i
                                    << " of " << n << " keys, grid for " << lengths.longest;
          if (n > 1) {  // the check can tell: half the keys land far outside it
            EXPECT_GT((attention(n / 2) - want).abs().max().item<double>(), 4 * tolerance);
          }
        }
      }
    }
  }
  // What it refuses (SdpaAttention falls back to FA2): fp32, heads of 96 channels, 16 heads a group.
  const at::TensorOptions o = at::TensorOptions().device(gpu).dtype(at::kBFloat16);
  EXPECT_FALSE(kernels::decode_attention_takes(at::zeros({1, 8, 64}, o.dtype(at::kFloat)), at::zeros({8, 2, 64}, o.dtype(at::kFloat)),
                                               at::zeros({8, 2, 64}, o.dtype(at::kFloat))));
  EXPECT_FALSE(kernels::decode_attention_takes(at::zeros({1, 8, 96}, o), at::zeros({8, 2, 96}, o), at::zeros({8, 2, 96}, o)));
  EXPECT_FALSE(kernels::decode_attention_takes(at::zeros({1, 32, 64}, o), at::zeros({8, 2, 64}, o), at::zeros({8, 2, 64}, o)));
}

// The one-row linear layer against the fp32 product: output sizes that do and do not fill the
// kernel's four-row blocks, a reduction length of whole and partial 128-thread strides, with and
// without a bias, bf16 and fp16, a weight that is a row-strided view; and the cases it refuses
// (two rows, a gradient wanted, a misaligned view, fp32, k past 8192), which callers send to cuBLAS.
TEST(GenerationCudaKernels, GemvEqualsTheFp32Product) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(5);
  const at::Device gpu(at::kCUDA, 0);
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const at::TensorOptions o = at::TensorOptions().device(gpu).dtype(dtype);
    for (int64_t n : {4, 2050, 32003}) {
      for (int64_t k : {2048, 5632, 1032}) {
        const at::Tensor x = at::randn({1, 1, k}, o);
        const at::Tensor weight = at::randn({n, k + 16}, o).narrow(1, 8, k);  // rows 16-byte aligned, stride k + 16
        const at::Tensor bias = at::randn({n}, o);
        for (bool with_bias : {false, true}) {
          const at::Tensor b = with_bias ? bias : at::Tensor();
          ASSERT_TRUE(kernels::gemv_takes(x, weight, b));
          const at::Tensor got = kernels::gemv(x, weight, b);
          at::Tensor want = at::matmul(x.to(at::kFloat), weight.to(at::kFloat).t());  // [1, 1, n]
          if (with_bias) want = want + bias.to(at::kFloat);
          ASSERT_EQ(got.sizes(), want.sizes());
          const std::string what = std::string(c10::toString(dtype)) + " n " + std::to_string(n) + " k " + std::to_string(k);
          EXPECT_LT((got.to(at::kFloat) - want).abs().max().item<double>(), 2e-2 * want.abs().max().item<double>()) << what;
          EXPECT_LT((got.to(at::kFloat) - want).norm().item<double>() / want.norm().item<double>(), 5e-3) << what;
        }
      }
    }
    const at::Tensor weight = at::randn({64, 256}, o);
    EXPECT_FALSE(kernels::gemv_takes(at::randn({2, 1, 256}, o), weight, {}));                       // two rows
    EXPECT_FALSE(kernels::gemv_takes(at::randn({1, 256}, o).requires_grad_(), weight, {}));         // a gradient wanted
    EXPECT_FALSE(kernels::gemv_takes(at::randn({1, 264}, o).narrow(1, 4, 256), weight, {}));        // not 16-byte aligned
    EXPECT_FALSE(kernels::gemv_takes(at::randn({1, 256}, o.dtype(at::kFloat)), weight.to(at::kFloat), {}));  // fp32: cuBLAS
    EXPECT_FALSE(kernels::gemv_takes(at::randn({1, 8200}, o), at::randn({64, 8200}, o), {}));  // a long reduction: cuBLAS
    at::NoGradGuard no_grad;
    EXPECT_TRUE(kernels::gemv_takes(at::randn({1, 256}, o).requires_grad_(), weight, {}));  // no grad mode: no gradient
  }
}

// SwiGLU's fc1 in one GEMV (kernels::linear_swiglu: the activation in the epilogue) equals the
// fp32 product of the gate and up rows through silu(gate) * up; where the GEMV does not take the
// operands (two rows) it is the linear layer and the SwiGLU kernel.
TEST(GenerationCudaKernels, GemvWithSwigluEqualsTheFp32Layer) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(6);
  const at::TensorOptions o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::NoGradGuard no_grad;
  for (int64_t f : {4, 5632, 1030}) {
    for (int64_t rows : {1, 2}) {
      const int64_t k = 2048;
      const at::Tensor x = at::randn({1, rows, k}, o);
      const at::Tensor weight = at::randn({2 * f, k}, o) * 0.05;
      const at::Tensor got = kernels::linear_swiglu(x, weight);  // [1, rows, f]
      const at::Tensor product = at::matmul(x.to(at::kFloat), weight.to(at::kFloat).t());  // [1, rows, 2f]
      const at::Tensor gate = product.narrow(-1, 0, f), up = product.narrow(-1, f, f);
      const at::Tensor want = at::silu(gate) * up;
      ASSERT_EQ(got.sizes(), want.sizes());
      const std::string what = "f " + std::to_string(f) + " rows " + std::to_string(rows);
      EXPECT_LT((got.to(at::kFloat) - want).norm().item<double>() / want.norm().item<double>(), 1e-2) << what;
      EXPECT_LT((got.to(at::kFloat) - want).abs().max().item<double>(), 3e-2 * want.abs().max().item<double>()) << what;
    }
  }
  EXPECT_THROW(kernels::linear_swiglu(at::randn({1, 1, 256}, o), at::randn({7, 256}, o)), c10::Error);  // not [gate; up]
}

// RoPE in the QKV GEMV's epilogue (kernels::gemv_rope_into_cache) against the GEMV and then
// rope_qkv_into_cache: the same queries and cache rows within a rounding step, the same values
// and residual sum to the bit; with the input norm in its
// prologue against gemv_after_norm then the same; with a bias (Qwen2's QKV), bf16 and fp16, heads of
// 64 and 128 channels; nothing else in the stores written.
TEST(GenerationCudaKernels, GemvWithRopeIntoCacheEqualsGemvThenRope) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::manual_seed(10);
  const at::NoGradGuard no_grad;
  const int64_t k = 512, rows = 12, groups = 2, per_group = 3;
  const at::Device gpu(at::kCUDA, 0);
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const at::TensorOptions o = at::TensorOptions().device(gpu).dtype(dtype);
    for (int64_t d : {64, 128}) {
      const int64_t n = groups * (per_group + 2) * d;
      const at::Tensor x = at::randn({1, 1, k}, o), delta = at::randn({1, 1, k}, o), gamma = at::rand({k}, o) + 0.5;
      const at::Tensor weight = at::randn({n, k}, o) * (1.0 / std::sqrt(double(k)));
      const at::Tensor bias = at::randn({n}, o) * 0.1;
      const at::Tensor angles = at::rand({1, 1, 1, d}, o.dtype(at::kFloat)) * 6.0;
      const at::Tensor cos = angles.cos(), sin = angles.sin();
      const at::Tensor store_rows = at::tensor(std::vector<int64_t>{7}, at::kLong).to(gpu);
      for (bool with_norm : {false, true}) {
        for (bool with_bias : {false, true}) {
          const std::string what = std::string(c10::toString(dtype)) + " d " + std::to_string(d) + (with_norm ? " norm" : "") +
                                   (with_bias ? " bias" : "");
          const at::Tensor b = with_bias ? bias : at::Tensor();
          const kernels::InputNorm norm{delta, gamma, 1e-6};
          kernels::QkvIntoCache into;
          into.heads_per_group = per_group;
          into.cos = cos, into.sin = sin, into.store_rows = store_rows;
          into.k_store = at::zeros({rows, groups, d}, o), into.v_store = at::zeros({rows, groups, d}, o);
          ASSERT_TRUE(kernels::gemv_rope_into_cache_takes(x, weight, b, into, with_norm ? &norm : nullptr)) << what;
          at::Tensor sum;
          const at::Tensor q = kernels::gemv_rope_into_cache(x, weight, b, into, with_norm ? &norm : nullptr, &sum);  // [1, 1, G P, d]
          // The reference: the GEMV (after the norm), then the RoPE-into-cache kernel.
          const kernels::NormedLinear qkv = with_norm ? kernels::gemv_after_norm(x, delta, gamma, 1e-6, weight, b, false)
                                                      : kernels::NormedLinear{x, kernels::gemv(x, weight, b)};
          const at::Tensor k_store = at::zeros({rows, groups, d}, o), v_store = at::zeros({rows, groups, d}, o);
          const at::Tensor want_q = kernels::qkv_rope_into_cache(qkv.y.view({1, 1, groups, (per_group + 2) * d}), per_group, cos, sin,
                                                                 k_store, v_store, store_rows);  // [1, 1, G P, d]
          ASSERT_EQ(q.sizes(), want_q.sizes()) << what;
          // The same rounded QKV output and the same rotation; the compiler may contract the
          // rotation's products differently in the two kernels: at most a rounding step apart.
          auto gap = [](const at::Tensor& a, const at::Tensor& b) {
            return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>() / b.to(at::kFloat).abs().max().item<double>();
          };
          EXPECT_LE(gap(q, want_q), 1.0 / 128) << what;
          EXPECT_LE(gap(into.k_store, k_store), 1.0 / 128) << what;
          EXPECT_TRUE(at::equal(into.v_store, v_store)) << what << ": the value copied as the GEMV rounds it";
          // The check can tell: unrotated queries land far outside it.
          EXPECT_GT(gap(qkv.y.view({1, 1, groups, per_group + 2, d}).narrow(3, 0, per_group).reshape(q.sizes()), want_q), 0.1) << what;
          if (with_norm) EXPECT_TRUE(at::equal(sum, qkv.sum)) << what;
          EXPECT_GT(into.k_store[7].abs().sum().item<double>(), 0.0) << what << ": row 7 written";
          EXPECT_EQ(into.k_store.narrow(0, 0, 7).abs().sum().item<double>(), 0.0) << what << ": no other row";
        }
      }
    }
  }
}

// The fixture `variant` on the first GPU in `dtype`.
GenerationModel gpu_model(const test::TempDir& dir, const std::string& variant, at::ScalarType dtype) {
  test::make_hf_model(dir.path(), variant);
  GenerationModel g = load_hf_for_generation(dir.path(), "", at::Device(at::kCUDA, 0), /*need_tokenizer=*/false);
  g.model->to(at::Device(at::kCUDA, 0), dtype);
  g.model->pack_experts();  // as the commands do after the last move (mixtures of experts)
  g.model->eval();
  return g;
}

TEST_P(GenerationCuda, CacheReadInPlaceEqualsFullForwardAndTheGatheredCache) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::NoGradGuard no_grad;
  test::TempDir dir;
  // fp16 (flash attention's other dtype): 3 more mantissa bits than bf16, a tighter check.
  GenerationModel g = gpu_model(dir, GetParam(), at::kHalf);
  GPTModel& model = *g.model;
  const at::Device gpu(at::kCUDA, 0);
  {
    const int64_t d = 24;  // what the check looks at: the device, the dtype, the head dims
    const at::Tensor q = at::zeros({1, 1, 2, d}, at::TensorOptions().device(gpu).dtype(at::kHalf));
    ASSERT_TRUE(flash_attention_reads_cache(q, q)) << "an sm80+ GPU in fp16: the in-place path must be the one tested";
    EXPECT_TRUE(flash_attention_reads_cache(q.to(at::kBFloat16), q.to(at::kBFloat16)));
    EXPECT_FALSE(flash_attention_reads_cache(q.to(at::kFloat), q.to(at::kFloat))) << "fp32 gathers";
  }

  // Slots 2 and 0 of 3 (given out of order), prompts of 9 and 4 tokens in one step (the shorter
  // padded: KvCacheStep's kept rows, as the engine prefills); then slot 2 takes a three-token
  // chunk after its prompt (a step of several new tokens over a cache that holds some); then
  // both decode together for six steps. The tokens are fixed (not chosen from the
  // logits), so both runs see the same sequences. Returns each checked position's logits [V] and
  // the whole sequence up to it.
  const std::vector<int64_t> slots = {2, 0};
  auto run = [&](bool in_place) {
    KvCache cache(static_cast<int64_t>(model.layers.size()), 3, 48);
    std::vector<Ids> sequences = {prompt_of(9, 5, g.vocab_size), prompt_of(4, 11, g.vocab_size)};
    std::vector<std::pair<at::Tensor, Ids>> checked;
    auto forward = [&](std::vector<int64_t> step_slots, const std::vector<Ids>& tokens) {
      int64_t s = 0;
      std::vector<int64_t> kept;
      for (const Ids& t : tokens) {
        kept.push_back(static_cast<int64_t>(t.size()));
        s = std::max(s, kept.back());
      }
      KvCacheStep step(cache, std::move(step_slots), s, gpu, kept);
      if (in_place) step.allow_reading_in_place();
      Ids flat;
      for (const Ids& t : tokens) {
        flat.insert(flat.end(), t.begin(), t.end());
        flat.insert(flat.end(), size_t(s) - t.size(), 1);  // padding
      }
      const at::Tensor tokens_tensor = at::tensor(flat, at::kLong).view({static_cast<int64_t>(tokens.size()), s}).to(gpu);
      const at::Tensor logits = model.forward_cached(tokens_tensor, step, /*last_position_only=*/false);  // [s, b, V]
      step.commit();
      return logits;
    };
    const at::Tensor prompt_logits = forward(slots, sequences);  // [9, 2, V]
    for (size_t j = 0; j < 2; ++j) checked.emplace_back(prompt_logits[int64_t(sequences[j].size()) - 1][int64_t(j)], sequences[j]);
    const Ids chunk = {17, 3, 7};
    const at::Tensor chunk_logits = forward({slots[0]}, {chunk});  // [3, 1, V]
    for (size_t i = 0; i < chunk.size(); ++i) {
      sequences[0].push_back(chunk[i]);
      checked.emplace_back(chunk_logits[int64_t(i)][0], sequences[0]);
    }
    for (int step = 0; step < 6; ++step) {
      const std::vector<Ids> next = {{(13 * step + 2) % g.vocab_size}, {(29 * step + 5) % g.vocab_size}};
      const at::Tensor logits = forward(slots, next);  // [1, 2, V]
      for (size_t j = 0; j < 2; ++j) {
        sequences[j].push_back(next[j][0]);
        checked.emplace_back(logits[0][int64_t(j)], sequences[j]);
      }
    }
    EXPECT_EQ(cache.length(2), 9 + 3 + 6);
    EXPECT_EQ(cache.length(0), 4 + 6);
    return checked;
  };
  const auto in_place = run(true), gathered = run(false);
  ASSERT_EQ(in_place.size(), gathered.size());
  for (size_t i = 0; i < in_place.size(); ++i) {
    const Ids& sequence = in_place[i].second;
    const at::Tensor want = model.forward(at::tensor(sequence, at::kLong).view({1, -1}).to(gpu))[-1][0];  // [V]
    EXPECT_LE(relative_gap(in_place[i].first, want), kTolerance) << GetParam() << ": position " << i << " against a full forward";
    EXPECT_LE(relative_gap(in_place[i].first, gathered[i].first), kTolerance) << GetParam() << ": position " << i << " against the gathered cache";
    if (i == 0) {
      // The check can tell: the same sequence with its first token changed lands far outside it.
      Ids altered = sequence;
      altered[0] = (altered[0] + 1) % g.vocab_size;
      const at::Tensor other = model.forward(at::tensor(altered, at::kLong).view({1, -1}).to(gpu))[-1][0];
      ASSERT_GT(relative_gap(other, want), 4 * kTolerance) << GetParam() << ": the fixture cannot tell a wrong key";
    }
  }
}

// One sequence decoding alone (batch 1) with the newer decode kernels (the decode attention
// kernel where the heads take it, the norms in the GEMVs' prologues, RoPE in the QKV GEMV's
// epilogue), alone and together, against a full forward over the same tokens.
TEST_P(GenerationCuda, OneSequenceDecodeEqualsFullForward) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::NoGradGuard no_grad;
  test::TempDir dir;
  GenerationModel g = gpu_model(dir, GetParam(), at::kHalf);
  GPTModel& model = *g.model;
  const at::Device gpu(at::kCUDA, 0);
  for (int which = 0; which < 4; ++which) {
    DecodeKernels kernels;  // each alone, then all three
    kernels.attention = which == 0 || which == 3;
    kernels.norms_in_gemv = which == 1 || which == 3;
    kernels.rope_in_gemv = which == 2 || which == 3;
    KvCache cache(static_cast<int64_t>(model.layers.size()), 2, 48);
    cache.use_decode_kernels(kernels);
    Ids sequence = prompt_of(7, 3, g.vocab_size);
    auto step = [&](const Ids& tokens) {
      KvCacheStep s(cache, {1}, static_cast<int64_t>(tokens.size()), gpu);
      s.allow_reading_in_place();
      const at::Tensor logits = model.forward_cached(at::tensor(tokens, at::kLong).view({1, -1}).to(gpu), s);  // [1, 1, V]: the last position
      s.commit();
      return logits;
    };
    step(sequence);
    for (int i = 0; i < 6; ++i) {
      const Ids next = {(11 * i + 4) % g.vocab_size};
      const at::Tensor logits = step(next)[-1][0];  // [V]
      sequence.push_back(next[0]);
      const at::Tensor want = model.forward(at::tensor(sequence, at::kLong).view({1, -1}).to(gpu))[-1][0];  // [V]
      EXPECT_LE(relative_gap(logits, want), kTolerance) << GetParam() << ", kernels " << which << ": decode step " << i;
    }
    // The paths were taken where the fixture allows them: the decode attention kernel for heads
    // of 64 channels, RoPE in the GEMV without q/k norms (llama3), the norms in every fixture.
    const DecodeKernels& run = cache.decode_kernels_run();
    EXPECT_EQ(run.attention, kernels.attention && GetParam() == "qwen3_head64") << GetParam() << ", kernels " << which;
    EXPECT_EQ(run.norms_in_gemv, kernels.norms_in_gemv) << GetParam() << ", kernels " << which;
    // fc2 prepares the next norm in every fixture (the output projection too where RoPE is in the QKV GEMV).
    EXPECT_EQ(run.norms_prepared_in_epilogues, kernels.norms_in_gemv) << GetParam() << ", kernels " << which;
    EXPECT_EQ(run.rope_in_gemv, kernels.rope_in_gemv && GetParam() == "llama3") << GetParam() << ", kernels " << which;
  }
}

// The engine of a graphs-against-eager test: `max_batch` slots; with `graphs`, decode steps
// replayed from CUDA graphs and attention as --attention-backend auto chooses it, else eager steps
// of FA2 over the sequences' lengths (the reference).
EngineOptions graphs_against_eager_options(const GenerationModel& g, int64_t max_batch, bool graphs) {
  EngineOptions options;
  options.max_batch = max_batch;
  options.vocab_size = g.vocab_size;
  options.cuda_graphs = graphs;
  options.decode_kernels.attention_where_faster = graphs;
  return options;
}

// Continuations of decode steps replayed from CUDA graphs against eager ones, request by request:
// the same tokens, each one's log-probability within rounding. `until_parted` (the expert
// fixtures): the tokens are not required equal; each request is compared up to the first token
// where the two runs part, most of the tokens still compared.
void expect_replayed_as_eager(const std::vector<GenerationResult>& eager, const std::vector<GenerationResult>& replayed,
                              const std::string& what, bool until_parted) {
  ASSERT_EQ(eager.size(), replayed.size()) << what;
  size_t compared = 0, total = 0;
  for (size_t i = 0; i < eager.size(); ++i) {
    if (!until_parted) EXPECT_EQ(replayed[i].tokens, eager[i].tokens) << what << ": request " << i;
    ASSERT_EQ(replayed[i].logprobs.size(), eager[i].logprobs.size()) << what << ": request " << i;
    total += eager[i].logprobs.size();
    for (size_t t = 0; t < eager[i].logprobs.size(); ++t) {
      // Each run's chosen token and its log-probability: equal tokens within rounding; where an
      // expert model's two runs part (below), their two choices were a near-tie.
      EXPECT_NEAR(replayed[i].logprobs[t].logprob, eager[i].logprobs[t].logprob, 0.02) << what << ": request " << i << ", token " << t;
      ++compared;
      // A replayed step splits the keys by its graph's bound, an eager one by the lengths: the
      // two round apart, and in a nearly flat distribution (the tiny expert fixtures' are: ~-4.1
      // for 96 tokens) they can pick either of two tokens a few thousandths apart. From there on
      // the continuations differ and are not compared.
      if (until_parted && replayed[i].tokens[t] != eager[i].tokens[t]) break;
    }
  }
  EXPECT_GE(2 * compared, total) << what << ": most of the tokens compared";
}

// Decode steps replayed from CUDA graphs against the same steps run eagerly: five prompts through
// three slots (graphs of 1, 2 and 3 sequences, sequences joining as others finish; one sequence
// crossing from the graphs attending to 64 keys to those attending to 128), greedy, each
// token's log-probability reported. The tokens are equal and the log-probabilities within rounding.
void expect_decode_graphs_equal_eager_steps(const std::string& variant, bool constant_routing = false, bool norms_in_gemv = false) {
  at::NoGradGuard no_grad;
  test::TempDir dir;
  const GenerationModel g = gpu_model(dir, variant, at::kBFloat16);
  if (constant_routing) {
    // Every token to the same experts (equal router logits, ties broken alike): a replayed step
    // attends with another split of the keys than an eager one (rounding apart), and under real
    // routing such a difference can flip a near-tied expert and the whole continuation after it.
    int routers = 0;
    for (auto& p : g.model->named_parameters()) {
      if (p.key().find("router.weight") != std::string::npos) p.value().zero_(), ++routers;
    }
    ASSERT_GT(routers, 0) << variant;
  }
  auto run = [&](bool graphs) {
    // The default's choice of attention in the graphs: the one-launch kernel for these steps of
    // 2-3 sequences up to 128 keys where it takes the heads (64 channels), FA2 for one sequence.
    EngineOptions options = graphs_against_eager_options(g, 3, graphs);
    options.decode_kernels.norms_in_gemv = norms_in_gemv;  // both runs: the steps of one sequence
    Engine engine(*g.model, options);
    EXPECT_EQ(engine.decode_mode(), graphs ? "CUDA graphs" : "eager") << variant;
    std::vector<GenerationRequest> requests;
    for (int64_t i = 0; i < 5; ++i) {
      GenerationRequest r;
      r.prompt = prompt_of(3 + 2 * i, 7 * i + 1, g.vocab_size);
      r.max_new_tokens = 4 + 3 * i;  // finishing at different steps: the batch shrinks and refills
      r.sampling.greedy = true;
      r.logprobs = 0;
      requests.push_back(r);
    }
    // One that grows past 64 keys: its steps move from the graphs attending to 64 keys to those
    // attending to 128 (the fixture's whole cache), beside sequences that stay short.
    requests[1].prompt = prompt_of(58, 5, g.vocab_size);
    requests[1].max_new_tokens = 14;
    std::vector<GenerationResult> results = engine.generate(requests);
    // Each graph's capture is counted and timed apart from the steps: at least the three
    // sequences at 64 keys, the longer one's steps at 128, and a smaller batch at the end.
    const EngineStats& stats = engine.stats();
    EXPECT_EQ(stats.graph_captures >= 3, graphs) << variant << ": " << stats.graph_captures << " captures";
    EXPECT_EQ(stats.capture_seconds > 0.0, graphs) << variant;
    EXPECT_GT(stats.decode_seconds, 0.0) << variant;
    EXPECT_EQ(engine.decode_kernels_run().attention, graphs && variant == "qwen3_head64") << variant;
    EXPECT_EQ(engine.decode_kernels_run().norms_prepared_in_epilogues, norms_in_gemv) << variant << ": the last request's steps alone";
    return results;
  };
  const std::vector<GenerationResult> eager = run(false), replayed = run(true);
  expect_replayed_as_eager(eager, replayed, variant, /*until_parted=*/constant_routing);
}

TEST_P(GenerationCuda, DecodeGraphsEqualEagerSteps) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  expect_decode_graphs_equal_eager_steps(GetParam());
  // With the norms in the GEMVs (prepared by the GEMVs before them) in the steps of one sequence.
  expect_decode_graphs_equal_eager_steps(GetParam(), /*constant_routing=*/false, /*norms_in_gemv=*/true);
}

// Steps of more than 16 sequences (20 slots: graphs of 20 rows) attend to a key bound too since
// session 45, and the default's attention takes the one-launch kernel for them (up to 256 keys
// at 17-32 rows; the fixture's 64-channel heads): the same tokens as eager steps of FA2.
TEST(GenerationCudaGraphs, StepsOfTwentySequencesEqualEagerSteps) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  at::NoGradGuard no_grad;
  test::TempDir dir;
  const GenerationModel g = gpu_model(dir, "qwen3_head64", at::kBFloat16);
  auto run = [&](bool graphs) {
    Engine engine(*g.model, graphs_against_eager_options(g, 20, graphs));
    std::vector<GenerationRequest> requests;
    for (int64_t i = 0; i < 20; ++i) {
      GenerationRequest r;
      r.prompt = prompt_of(3 + i % 7, 5 * i + 1, g.vocab_size);
      r.max_new_tokens = 6;  // all admitted before the first decode step, all as long: steps of 20
      r.sampling.greedy = true;
      r.logprobs = 0;
      requests.push_back(r);
    }
    std::vector<GenerationResult> results = engine.generate(requests);
    EXPECT_EQ(engine.decode_kernels_run().attention, graphs) << "the kernel took the steps of 20 sequences";
    return results;
  };
  const std::vector<GenerationResult> eager = run(false), replayed = run(true);
  expect_replayed_as_eager(eager, replayed, "20 sequences", /*until_parted=*/false);
}

// Mixtures of experts replay their decode steps too: the grouped GEMM over the packed experts, the
// tokens per expert counted on the device (top-2 of 4 experts; Qwen2-MoE's shared expert behind
// its gate). The routers are zeroed so both runs route alike (see the helper), and the runs are
// compared up to where they part at a near-tie. Session 35 on an H100: with real routing Mixtral
// matched and the other two parted after 1-3 tokens; with zeroed routers Qwen3-MoE's request 3
// still parted at its fourth token, between two tokens of log-probabilities within 0.02 (~-4.1,
// the fixture's nearly flat distribution), the continuations different after it.
class GenerationCudaMoe : public ::testing::TestWithParam<std::string> {};

TEST_P(GenerationCudaMoe, DecodeGraphsEqualEagerSteps) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device here; scripts/gpu/run.sh runs this on the GPU machine";
  expect_decode_graphs_equal_eager_steps(GetParam(), /*constant_routing=*/true);
}

INSTANTIATE_TEST_SUITE_P(Families, GenerationCudaMoe, ::testing::Values("mixtral", "qwen2_moe", "qwen3_moe"),
                         [](const auto& info) { return info.param; });

// qwen3_head64: heads of 64 channels, which the decode attention kernel takes (the others' fall to FA2).
INSTANTIATE_TEST_SUITE_P(Families, GenerationCuda, ::testing::Values("llama3", "qwen3", "qwen3_head64"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace megatron
