// Attention of some queries over one block of keys, with the log-sum-exp of each query's scores,
// so that blocks seen one after another merge into the attention over all of them (ring
// attention's arithmetic). Layout as SDPA's: q [b, H, sq, d], k [b, G, sk, d], v [b, G, sk, dv]
// (G key/value heads shared by H / G query heads each, no copies).
//
// The backward of a block takes the merged output and log-sum-exp, not the block's own: with
// P = exp(S - lse_merged) the block's share of the softmax and D = rowsum(dout * out_merged),
// dS = P * (dout v^T - D) is exactly the block's part of the whole attention's gradient.
//
// On CUDA in fp16 / bf16 (no mask, head dim % 8) the blocks run fused kernels: cuDNN's attention
// on Hopper (head dim <= 128; the kernel SDPA picks there, 1.5x FlashAttention-2's speed at long
// sequences; grouped K/V heads taken as they are), FlashAttention-2's elsewhere (head dim <= 256);
// explicit fp32 arithmetic otherwise and under a mask. A cuDNN call that fails falls back to FA2 for the rest of the run, said once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace megatron::cp {

// Which kernel runs a block: Auto picks as above; the others force one (tests, the bench).
enum class BlockKernel { Auto, Cudnn, Flash, Arithmetic };

// A block's result: out in fp32 from the arithmetic, in q's dtype from the fused kernels (no fp32
// copy: the merge reads it as it is). An accumulator's out is fp32.
struct PartialAttention {
  at::Tensor out;  // [b, H, sq, dv]
  at::Tensor lse;  // [b, H, sq] fp32; -inf where a query saw no key
};

// Whether a block of these runs a fused kernel (without a mask): CUDA, compute capability 8.0+,
// bf16 or fp16, one head dim for q and v, a multiple of 8 up to 256.
bool fused_kernels_take(const at::Tensor& q, const at::Tensor& v);

// An empty accumulator for `rows` queries: out zeros, lse -inf.
PartialAttention empty_partial(int64_t b, int64_t heads, int64_t rows, int64_t value_dim, const at::TensorOptions& options);

// The accumulator that a first block covering every row starts as: its result in fp32, without a
// merge into zeros (one pass instead of three). Takes the block's tensors over (fp32 ones become
// the accumulator's and are written by later merges).
PartialAttention accumulator_from(PartialAttention&& first);

// causal: square block on the diagonal (key j visible to query i when j <= i). mask: [b, 1, sq, sk]
// bool, true = may attend, or undefined.
PartialAttention attend_block(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                              const at::Tensor& mask, double scale, BlockKernel kernel = BlockKernel::Auto);

// fp32 from the arithmetic, q's dtype from the fused kernels: callers add them into fp32 sums
// (an in-place add reads them as they are).
struct BlockGrads {
  at::Tensor dq;  // [b, H, sq, d]
  at::Tensor dk;  // [b, G, sk, d]
  at::Tensor dv;  // [b, G, sk, dv]
};

// dout, out: [b, H, sq, dv] (the merged output's gradient and the merged output, q's dtype);
// lse: [b, H, sq] merged.
BlockGrads attend_block_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& out, const at::Tensor& lse, bool causal, const at::Tensor& mask,
                                 double scale, BlockKernel kernel = BlockKernel::Auto);

// Folds `part` (rows [first_row, first_row + its rows) of `into`) into `into` (fp32), in place, by
// log-sum-exp (kernels::attention_merge: one CUDA pass over the rows, ATen's composite elsewhere).
void merge_into(PartialAttention& into, const PartialAttention& part, int64_t first_row);

}  // namespace megatron::cp
