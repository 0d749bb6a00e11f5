#include "context_parallel/partial_attention.h"

#include <ATen/ATen.h>

#include <atomic>
#include <cstdio>
#include <limits>

#include "core/cuda_device.h"
#include "kernels/attention_ops.h"

namespace megatron::cp {

namespace {

constexpr double kNegativeInfinity = -std::numeric_limits<double>::infinity();

std::atomic<bool> cudnn_failed{false};  // a cuDNN block failed once: FA2 for the rest of the run

BlockKernel choose(const at::Tensor& q, const at::Tensor& v, const at::Tensor& mask, BlockKernel asked) {
  if (asked != BlockKernel::Auto) return asked;
  if (mask.defined() || !fused_kernels_take(q, v)) return BlockKernel::Arithmetic;
  if (q.size(-1) <= 128 && cuda_compute_capability_major(q.device()) == 9 && !cudnn_failed.load()) return BlockKernel::Cudnn;
  return BlockKernel::Flash;
}

// Auto's cuDNN call, or FA2's when it throws (said once; FA2 from then on).
template <typename Cudnn, typename Flash>
auto cudnn_or_flash(BlockKernel asked, const Cudnn& cudnn, const Flash& flash) {
  if (asked == BlockKernel::Cudnn) return cudnn();
  try {
    return cudnn();
  } catch (const c10::Error& e) {
    if (!cudnn_failed.exchange(true)) {
      const std::string why = e.what_without_backtrace();
      std::fprintf(stderr, "> context parallelism: cuDNN attention failed on a ring block (%s); the blocks use FlashAttention-2\n",
                   why.substr(0, why.find('\n')).c_str());
    }
    return flash();
  }
}

// cuDNN's graph takes grouped key/value heads as they are (G of them for H query heads), and
// gives their gradients back per key/value head: no repeated copies either way.
PartialAttention cudnn_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, double scale) {
  auto result = at::_scaled_dot_product_cudnn_attention(q, k, v, std::nullopt, /*compute_log_sumexp=*/true, /*dropout_p=*/0.0,
                                                        causal, /*return_debug_mask=*/false, scale);
  const at::Tensor& out = std::get<0>(result);  // [b, H, sq, dv], q's dtype
  const at::Tensor& lse = std::get<1>(result);  // [b, H, sq] or [b, H, sq, 1], natural log, fp32
  return {out, lse.reshape({q.size(0), q.size(1), q.size(2)}).to(at::kFloat)};
}

PartialAttention flash_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal, double scale) {
  // Flash takes [b, s, heads, d]; its log-sum-exp comes back [b, H, sq] in fp32.
  auto [out, lse, rng, unused, debug] = at::_flash_attention_forward(
      q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), std::nullopt, std::nullopt, q.size(2), k.size(2),
      /*dropout_p=*/0.0, causal, /*return_debug_mask=*/false, scale);
  return {out.transpose(1, 2), lse};  // [b, H, sq, dv] in q's dtype
}

BlockGrads cudnn_block_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& out, const at::Tensor& lse, bool causal, double scale) {
  const at::TensorOptions longs = q.options().dtype(at::kLong);
  // No dropout: the graph has no dropout node and never reads the generator's seed and offset,
  // so they are left unfilled (no fill kernels between the blocks).
  auto [dq, dk, dv] = at::_scaled_dot_product_cudnn_attention_backward(
      dout, q, k, v, out, lse.unsqueeze(-1).contiguous(), at::empty({}, longs), at::empty({}, longs), at::Tensor(), at::Tensor(),
      at::Tensor(), q.size(2), k.size(2), /*dropout_p=*/0.0, causal, scale);
  return {dq, dk, dv};  // q's dtype; dk, dv per key/value head
}

BlockGrads flash_block_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& out, const at::Tensor& lse, bool causal, double scale) {
  const at::Tensor none;
  const at::Tensor rng_state = at::zeros({2}, q.options().dtype(at::kLong));  // no dropout: never read
  auto [dq, dk, dv] = at::_flash_attention_backward(
      dout.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), out.transpose(1, 2), lse, none, none,
      q.size(2), k.size(2), /*dropout_p=*/0.0, causal, rng_state, at::empty({0}, q.options()), scale);
  return {dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)};  // q's dtype
}

// The scores of every query head over the block's keys, its group's: [b, G, H/G, sq, sk] fp32,
// -inf where not visible.
at::Tensor block_scores(const at::Tensor& q, const at::Tensor& k, bool causal, const at::Tensor& mask, double scale) {
  const int64_t b = q.size(0), heads = q.size(1), sq = q.size(2), groups = k.size(1), sk = k.size(2);
  const at::Tensor q5 = q.to(at::kFloat).view({b, groups, heads / groups, sq, q.size(3)});
  const at::Tensor k5 = k.to(at::kFloat).unsqueeze(2);                                      // [b, G, 1, sk, d]
  at::Tensor scores = at::matmul(q5, k5.transpose(-1, -2)).mul_(scale);                     // [b, G, H/G, sq, sk]
  if (causal) {
    const at::Tensor hidden = at::ones({sq, sk}, q.options().dtype(at::kBool)).triu(1);
    scores.masked_fill_(hidden, kNegativeInfinity);
  }
  if (mask.defined()) scores.masked_fill_(mask.logical_not().unsqueeze(1), kNegativeInfinity);  // [b, 1, 1, sq, sk]
  return scores;
}

// exp(scores - lse) with rows that saw nothing (lse -inf) left at zero.
at::Tensor probabilities(const at::Tensor& scores, const at::Tensor& lse5) {
  return at::exp(scores - at::where(lse5.isinf(), at::zeros_like(lse5), lse5));
}

}  // namespace

bool fused_kernels_take(const at::Tensor& q, const at::Tensor& v) {
  const int64_t d = q.size(-1);
  return q.is_cuda() && cuda_compute_capability_major(q.device()) >= 8 &&
         (q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf) && v.size(-1) == d && d % 8 == 0 && d <= 256;
}

PartialAttention empty_partial(int64_t b, int64_t heads, int64_t rows, int64_t value_dim, const at::TensorOptions& options) {
  const at::TensorOptions f = options.dtype(at::kFloat);
  return {at::zeros({b, heads, rows, value_dim}, f), at::full({b, heads, rows}, kNegativeInfinity, f)};
}

PartialAttention attend_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                              const at::Tensor& mask, double scale, BlockKernel kernel) {
  switch (choose(q, v, mask, kernel)) {
    case BlockKernel::Cudnn:
      return cudnn_or_flash(kernel, [&] { return cudnn_block(q, k, v, causal, scale); },
                            [&] { return flash_block(q, k, v, causal, scale); });
    case BlockKernel::Flash: return flash_block(q, k, v, causal, scale);
    default: break;
  }
  const int64_t b = q.size(0), heads = q.size(1), sq = q.size(2);
  const at::Tensor scores = block_scores(q, k, causal, mask, scale);  // [b, G, H/G, sq, sk]
  const at::Tensor lse = at::logsumexp(scores, -1, /*keepdim=*/true);
  const at::Tensor out = at::matmul(probabilities(scores, lse), v.to(at::kFloat).unsqueeze(2));  // [b, G, H/G, sq, dv]
  return {out.reshape({b, heads, sq, v.size(3)}), lse.reshape({b, heads, sq})};
}

BlockGrads attend_block_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& out, const at::Tensor& lse, bool causal, const at::Tensor& mask,
                                 double scale, BlockKernel kernel) {
  switch (choose(q, v, mask, kernel)) {
    case BlockKernel::Cudnn:
      return cudnn_or_flash(kernel, [&] { return cudnn_block_backward(dout, q, k, v, out, lse, causal, scale); },
                            [&] { return flash_block_backward(dout, q, k, v, out, lse, causal, scale); });
    case BlockKernel::Flash: return flash_block_backward(dout, q, k, v, out, lse, causal, scale);
    default: break;
  }
  const int64_t b = q.size(0), heads = q.size(1), sq = q.size(2), groups = k.size(1), per_group = heads / groups;
  const at::Tensor scores = block_scores(q, k, causal, mask, scale);                          // [b, G, H/G, sq, sk]
  const at::Tensor p = probabilities(scores, lse.to(at::kFloat).view({b, groups, per_group, sq, 1}));
  const at::Tensor dout5 = dout.to(at::kFloat).view({b, groups, per_group, sq, dout.size(3)});
  const at::Tensor out5 = out.to(at::kFloat).view_as(dout5);
  const at::Tensor v5 = v.to(at::kFloat).unsqueeze(2);                                        // [b, G, 1, sk, dv]
  const at::Tensor dv = at::matmul(p.transpose(-1, -2), dout5).sum(2);                        // [b, G, sk, dv]
  const at::Tensor delta = (dout5 * out5).sum(-1, /*keepdim=*/true);                          // [b, G, H/G, sq, 1]
  const at::Tensor ds = p * (at::matmul(dout5, v5.transpose(-1, -2)) - delta);                // [b, G, H/G, sq, sk]
  const at::Tensor q5 = q.to(at::kFloat).view({b, groups, per_group, sq, q.size(3)});
  const at::Tensor dq = at::matmul(ds, k.to(at::kFloat).unsqueeze(2)).mul_(scale).reshape({b, heads, sq, q.size(3)});
  const at::Tensor dk = at::matmul(ds.transpose(-1, -2), q5).sum(2).mul_(scale);              // [b, G, sk, d]
  return {dq, dk, dv};
}

void merge_into(PartialAttention& into, const PartialAttention& part, int64_t first_row) {
  const int64_t rows = part.lse.size(2);
  // Views into the accumulator, written in place (one pass on CUDA).
  kernels::attention_merge(into.out.narrow(2, first_row, rows), into.lse.narrow(2, first_row, rows), part.out, part.lse);
}

PartialAttention accumulator_from(PartialAttention&& first) {
  at::Tensor out = first.out;  // the arithmetic's is fp32 and contiguous already: taken as it is
  if (out.scalar_type() != at::kFloat || !out.is_contiguous()) out = at::empty(out.sizes(), out.options().dtype(at::kFloat)).copy_(out);
  return {out, first.lse.to(at::kFloat)};
}

}  // namespace megatron::cp
