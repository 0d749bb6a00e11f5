// Ring attention's log-sum-exp merge as LibTorch sees it: the one-pass CUDA kernel of
// attention_merge.cu where the build has it and the accumulator lives on a CUDA device, ATen's
// composite of the same arithmetic elsewhere (Impl::Composite forces it; the CUDA test compares).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "kernels/ops.h"

namespace megatron::kernels {

// Folds a block's rows into the accumulator's, in place:
//   lse' = logaddexp(lse, part_lse), out' = out * exp(lse - lse') + part_out * exp(part_lse - lse'),
// rows where both log-sum-exps are -inf left at zero.
// out [b, H, rows, dv] fp32 and lse [b, H, rows] fp32 (views into the accumulator are fine);
// part_out [b, H, rows, dv] in any float dtype, part_lse [b, H, rows] fp32.
void attention_merge(const at::Tensor& out, const at::Tensor& lse, const at::Tensor& part_out, const at::Tensor& part_lse,
                     Impl impl = Impl::Auto);

// Ring attention's blocks combined once (attention_merge.cu's attention_combine): each part's out
// [b, H, rows_i, dv] covers rows [first_row, first_row + rows_i) of the result; with log-sum-exps
// ([b, H, rows_i] fp32, all parts or none) the attention over every part, else their sum (a
// gradient's). -> [b, H, rows, dv] in the parts' dtype (fp32 where they differ), summed in fp32;
// `lse_out` ([b, H, rows] fp32), if defined, receives the merged log-sum-exp. A row no part covers
// is zero (lse -inf). The kernel on CUDA for at most 4 parts of one dtype, ATen's composite else.
struct CombinedPart {
  at::Tensor out, lse;
  int64_t first_row = 0;
};
constexpr int kMostCombinedParts = 4;  // what the kernel takes in one pass
at::Tensor attention_combine(const std::vector<CombinedPart>& parts, int64_t rows, const at::Tensor& lse_out, Impl impl = Impl::Auto);

// Ring attention's share of a step's key and value gradients into the fp32 sums that travel the
// ring: sum_k += dk and sum_v += dv (overwrite: =), each [b, G, rows, d] (views of the packed sum
// and of a group's gradients), dk / dv in one float dtype, upcast as read. One CUDA launch for
// both where every (batch, head)'s rows are contiguous in all four (attention_merge.cu: ATen's
// mixed-dtype add takes its element-at-a-time casting path, two launches); ATen's add_ / copy_ else.
void add_key_value_grads(const at::Tensor& sum_k, const at::Tensor& sum_v, const at::Tensor& dk, const at::Tensor& dv, bool overwrite,
                         Impl impl = Impl::Auto);

// The decode step's QKV output [s, b, G, (P + 2) * d] (split_qkv_rope's layout) in one pass: the
// queries rotated into the result [s, b, G * P, d], the key rotated and the value copied into the
// cache's stores [rows, G, d] at rows store_rows ([b s] int64, sequence-major). No autograd.
// qkv_rope_into_cache_takes: a CUDA build, bf16 / fp16 on a CUDA device, heads in 16-byte packs,
// whole-head rotation (fp32 tables [>= s, 1 or b, 1, head_dim]).
bool qkv_rope_into_cache_takes(const at::Tensor& qkv, int64_t head_dim, const at::Tensor& cos);
at::Tensor qkv_rope_into_cache(const at::Tensor& qkv, int64_t heads_per_group, const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& k_store, const at::Tensor& v_store, const at::Tensor& store_rows);

// Attention of a decode step over the cache where it lies, in one launch (decode_attention.cu):
// q [b, H, d] (one new token per sequence, its key and value already in the stores); k_store,
// v_store [rows, G, d]; sequence i's keys are the rows key_starts[i] .. + key_counts[i] (int32 on
// the device). longest: the most keys any sequence may hold (under a CUDA graph the cache's
// capacity), which fixes the grid; tickets: int32 zeros on the device, at least
// decode_attention_tickets(b, G) of them, left zero (shared by the layers of a step). -> [b, H, d].
// decode_attention_takes: a CUDA build; q bf16 / fp16 on a CUDA device, contiguous; stores of its
// dtype, 16-byte rows; d 64 or 128; at most 8 query heads a KV group.
bool decode_attention_takes(const at::Tensor& q, const at::Tensor& k_store, const at::Tensor& v_store);
int64_t decode_attention_tickets(int64_t batch, int64_t groups);
// Whether a grid for `batch` sequences of at most `longest` keys over `groups` KV groups merges its
// key splits in a thread-block cluster (a CUDA build, an sm_90 device, at most 512 keys, the grid
// within one wave of blocks) rather than through global memory.
bool decode_attention_merges_in_cluster(int64_t longest, int64_t batch, int64_t groups);
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_store, const at::Tensor& v_store, const at::Tensor& key_starts,
                            const at::Tensor& key_counts, int64_t longest, double scale, const at::Tensor& tickets);

}  // namespace megatron::kernels
