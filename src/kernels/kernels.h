// Launchers of megatron.cpp's fused CUDA kernels (src/kernels/*.cu). Plain C++ on purpose:
// pointers, sizes, strides and a stream, no LibTorch and no CUDA headers, so the kernels compile
// with nvcc alone and src/kernels/ops.cpp (the LibTorch side: dispatch, autograd, fallbacks)
// includes this from any build. Every kernel computes in fp32 whatever the storage type.
// A launch failure throws std::runtime_error naming the kernel and CUDA's message.
#pragma once

#include <cstdint>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace megatron::kernels::cuda {

using Stream = CUstream_st*;

enum class DType { Float32, BFloat16, Float16 };

// Rotary embedding (rotate-half form) of x [s, b, n, d] into y [s, b, n, d] (contiguous):
// the first rot_dim channels of each head rotate, the rest pass through. x may be a strided view
// (the query / key part of the fused QKV output) as long as its last dimension is contiguous;
// its heads may come in groups (the queries of each query group in the QKV output): head i is at
// (i / heads_per_group) * x_stride_group + (i % heads_per_group) * x_stride_n.
// cos / sin are fp32 [s, b or 1, 1, rot_dim]; a stride of 0 broadcasts over the batch.
// `inverse` applies the transpose of the rotation (the backward pass: dx = R^T dy).
struct RopeArgs {
  const void* x;
  void* y;
  const float* cos;
  const float* sin;
  int64_t s, b, n, d, rot_dim;
  int64_t x_stride_s, x_stride_b, x_stride_n;      // in elements
  int64_t heads_per_group, x_stride_group;         // n and 0 when the heads are not grouped
  int64_t y_stride_s, y_stride_b, y_stride_n, y_stride_group;  // y's, alike (d contiguous in both)
  int64_t table_stride_s, table_stride_b;          // in elements; table_stride_b 0: shared by the batch
  DType dtype;
  bool inverse;
};
void rope(const RopeArgs& args, Stream stream);

// A decode step's QKV output into attention's operands, in one pass (generation; no backward):
// qkv [s, b, G, (P + 2) * d] (per group: P query heads, one key head, one value head; strides in
// elements, channels contiguous). The queries rotate into q_out [s, b, G * P, d] (contiguous); the
// key rotates and the value is copied into the cache stores [rows, G, d] at row store_rows[bi * s + si]
// (int64 on the device, sequence-major) for token (si, bi). Whole-head rotation; cos / sin as RopeArgs'.
struct QkvIntoCacheArgs {
  const void* qkv;
  void* q_out;
  void* k_store;
  void* v_store;
  const int64_t* store_rows;
  const float* cos;
  const float* sin;
  int64_t s, b, groups, heads_per_group, d;
  int64_t x_stride_s, x_stride_b, x_stride_group;
  int64_t store_stride_row, store_stride_group;
  int64_t table_stride_s, table_stride_b;
  DType dtype;
};
bool rope_qkv_into_cache_supported(const QkvIntoCacheArgs& args);  // bf16 / fp16, 16-byte packs
void rope_qkv_into_cache(const QkvIntoCacheArgs& args, Stream stream);

// The index of each row's largest value into out[rows] (int64): x [rows, n] with rows `row_stride`
// elements apart, the values contiguous; the first index among equal maxima, NaN above every
// number (at::argmax(-1)'s answer). Greedy decoding's choice (argmax.cu).
struct RowArgmaxArgs {
  const void* x;
  int64_t* out;
  int64_t rows, n, row_stride;
  DType dtype;
};
void row_argmax(const RowArgmaxArgs& args, Stream stream);

// SwiGLU over rows of [gate | up] (in: [rows, 2f], out: [rows, f]): out = silu(gate) * up.
void swiglu_forward(const void* in, void* out, int64_t rows, int64_t f, DType dtype, Stream stream);
// grad_in [rows, 2f] from grad_out [rows, f] and the saved input.
void swiglu_backward(const void* grad_out, const void* in, void* grad_in, int64_t rows, int64_t f, DType dtype,
                     Stream stream);

// Cross entropy over this rank's vocabulary slice [first, first + vocab) of logits [rows, vocab]
// (row-contiguous). Per row: the slice's max, sum(exp(logit - max)) over the slice, and the
// target's logit where the target falls in the slice (else 0). The caller combines slices over
// tensor-parallel ranks and forms loss = log(sum) + max - target_logit.
void cross_entropy_stats(const void* logits, const int64_t* targets, int64_t rows, int64_t vocab, int64_t first,
                         DType dtype, float* max, float* sum_exp, float* target_logit, Stream stream);
// grad_logits = (softmax - one_hot(target)) * grad_loss, from the global row max and sum.
// grad_logits may alias logits (the gradient overwrites the saved logits in place).
void cross_entropy_backward(const void* logits, const int64_t* targets, const float* max, const float* sum_exp,
                            const float* grad_loss, void* grad_logits, int64_t rows, int64_t vocab, int64_t first,
                            DType dtype, Stream stream);

// RMSNorm over rows of h channels (row-contiguous), optionally fused with the residual add in
// front of it. Forward: x = a (+ b, rounded to the storage type and written to `sum`), then
// y = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps) in fp32, rounded once; rstd [rows]
// is kept for the backward. Supported when rms_norm_supported(h, dtype) and the pointers are
// 16-byte aligned (the caller falls back to ATen otherwise).
bool rms_norm_supported(int64_t h, DType dtype);
void rms_norm_forward(const void* a, const void* b, const void* weight, void* sum, void* y, float* rstd, int64_t rows,
                      int64_t h, float eps, DType dtype, Stream stream);
// grad_x = rstd * (w * dy - xhat * mean(w * dy * xhat)) (+ grad_extra, the gradient reaching the
// residual sum directly), xhat = x * rstd; grad_weight = sum over rows of dy * xhat, through
// per-block partial sums in `workspace` [rms_norm_backward_blocks(rows), h] fp32.
int64_t rms_norm_backward_blocks(int64_t rows);
void rms_norm_backward(const void* grad_y, const void* x, const void* weight, const float* rstd, const void* grad_extra,
                       void* grad_x, void* grad_weight, float* workspace, int64_t rows, int64_t h, DType dtype,
                       Stream stream);

// One AdamW step (PyTorch's AdamW arithmetic, decoupled weight decay) over n elements of fp32
// master weights and fp32 or bf16 moments (fp32 arithmetic), writing the updated weights also into `model` in its storage type
// (the bf16 parameter the model computes with) when model is not null: one pass instead of
// ATen's fused AdamW followed by a copy. The per-step scalars live on the device so a training
// step never waits for the host: the bias corrections (formed once per step from the device step
// count), gradients divided by *grad_scale as they are read (gradient clipping), and *found_inf
// != 0 skipping the step (nothing is written), as in ATen's fused AdamW.
struct AdamWArgs {
  // fp32 master weights; or, with master_remainder, their low 16 bits as int16 remainders whose
  // high half is the bf16 model weight (Megatron's store_param_remainders).
  void* master;
  bool master_remainder;
  void* exp_avg;        // fp32, or bf16 (--use-precision-aware-optimizer --exp-avg-dtype bf16)
  void* exp_avg_sq;     // fp32, or bf16 (... --exp-avg-sq-dtype bf16)
  DType exp_avg_dtype;
  DType exp_avg_sq_dtype;
  const void* grad;     // fp32, or bf16 with --grad-reduce-in-bf16
  DType grad_dtype;
  void* model;          // null: the master is the model's own fp32 tensor
  DType model_dtype;
  int64_t n;
  float beta1, beta2, eps, weight_decay;
  const double* lr;               // device scalar: the learning rate (so a captured step reads the current one)
  const float* bias_corrections;  // device [2]: 1 - beta1^step, sqrt(1 - beta2^step)
  const float* grad_scale;        // device scalar
  const float* found_inf;         // device scalar
};
void adamw_step(const AdamWArgs& args, Stream stream);

// dst (fp32, n elements) = src, or dst += src, src in its storage type (upcast as read).
void accumulate_into_fp32(float* dst, const void* src, int64_t n, DType src_dtype, bool overwrite, Stream stream);

// Ring attention's merge of a block into its accumulator (src/kernels/attention_merge.cu), per
// (batch, head, row): lse' = logaddexp(lse, part_lse), out' = out * exp(lse - lse') +
// part_out * exp(part_lse - lse'); a row where both are -inf stays as it is. out / lse are the
// accumulator's rows (fp32), part_out the block's (fp32, bf16 or fp16); every tensor [b, H, rows(, dv)]
// with the strides given in elements and the value channels contiguous.
struct AttentionMergeArgs {
  float* out;
  float* lse;
  const void* part_out;
  const float* part_lse;
  DType part_dtype;
  int64_t b, heads, rows, dv;
  int64_t out_stride_b, out_stride_h, out_stride_row;
  int64_t lse_stride_b, lse_stride_h, lse_stride_row;
  int64_t part_stride_b, part_stride_h, part_stride_row;
  int64_t part_lse_stride_b, part_lse_stride_h, part_lse_stride_row;
};
void attention_merge(const AttentionMergeArgs& args, Stream stream);

// Ring attention's blocks combined once, at the end (attention_merge.cu), per (batch, head, row)
// over the parts covering the row: lse = log sum_i exp(lse_i), out = sum_i part_i exp(lse_i - lse)
// (out_lse written where non-null); parts without log-sum-exps (a gradient's sum): out = sum_i
// part_i. Sums in fp32, out in the parts' storage type, one read of each part and one write of
// out. A row no part covers, or whose parts saw no key, is zero (lse -inf). Strides in elements,
// value channels contiguous.
constexpr int kMaxCombinedParts = 4;
struct AttentionCombineArgs {
  void* out;
  float* out_lse;  // null: not written
  DType dtype;
  int64_t b, heads, rows, dv;
  int64_t out_stride_b, out_stride_h, out_stride_row;
  int64_t lse_stride_b, lse_stride_h, lse_stride_row;
  int parts = 0;
  struct Part {
    const void* out;
    const float* lse;  // null for every part, or for none
    int64_t first_row, rows;
    int64_t stride_b, stride_h, stride_row;
    int64_t lse_stride_b, lse_stride_h, lse_stride_row;
  } part[kMaxCombinedParts];
};
void attention_combine(const AttentionCombineArgs& args, Stream stream);

// Ring attention's key and value gradient shares into the fp32 sums that travel the ring
// (attention_merge.cu), both in one launch: per part sum (+)= grad over [b, heads, rows, dim] with
// channels contiguous and any row stride (FA2 hands its gradients transposed, [b, s, heads, dim]
// viewed as [b, heads, s, dim]); grad in `dtype`, upcast as read; overwrite: = instead of +=.
struct KeyValueGradsArgs {
  struct Part {
    float* sum;
    const void* grad;
    int64_t b, heads, rows, dim;
    int64_t sum_stride_b, sum_stride_h, sum_stride_row, grad_stride_b, grad_stride_h, grad_stride_row;  // in elements
  } pair[2];
  DType dtype;
  bool overwrite;
};
void add_key_value_grads(const KeyValueGradsArgs& args, Stream stream);

// A batch-1 decode step's QKV GEMV with RoPE in its epilogue (GemvArgs::rope, q_out non-null):
// its n = G (P + 2) d output rows are G groups of P query heads, a key and a value of d channels;
// the queries rotate into q_out [G P d], the key rotates into its cache row, the value is copied
// there: what rope_qkv_into_cache does with the rounded output (whole-head rotation, channel j
// paired with j + d/2; d a multiple of 4).
struct GemvRopeIntoCache {
  void* q_out = nullptr;
  void* k_store = nullptr;  // the cache's stores: row store_row[0], group g at + g * store_stride_group
  void* v_store = nullptr;
  const int64_t* store_row = nullptr;
  const float* cos = nullptr;  // [d]: this token's tables
  const float* sin = nullptr;
  int64_t head_dim = 0, heads_per_group = 0, store_stride_row = 0, store_stride_group = 0;
};

// y [n] = W [n, k] x [k] (+ bias [n]) for one row x, fp32 accumulation (src/kernels/gemv.cu): the
// decode step's linear layers at batch 1. bf16 / fp16; k and W's row stride multiples of 8, x and
// W 16-byte aligned; bias may be null. gated (SwiGLU's fc1): W holds 2n rows [gate; up] and
// y [n] = silu(gate x) * (up x), no bias. overlap_previous: launched to overlap the kernel before
// it on the stream (programmatic dependent launch, sm_90+; cuda_common.cuh).
// Output rows a block of the GEMV takes: the epilogue's squares_out holds n / kGemvRows floats.
constexpr int64_t kGemvRows = 4;
struct GemvArgs {
  const void* x;
  const void* w;
  const void* bias;
  void* y;
  DType dtype;
  int64_t n, k, w_stride;
  bool gated = false;
  bool overlap_previous = true;
  // A pending RMSNorm (norm_weight non-null): the GEMV's input is rms_norm(x + add) * norm_weight
  // (add null: rms_norm(x)), the sum rounded to the storage type first as kernels::add_rms_norm
  // rounds it; the norm's 1 / rms scales the dot products of the sum times norm_weight (the normed
  // input is not rounded on its way, as add_rms_norm's output is: the results agree to its
  // rounding); block 0 writes the rounded sum to sum_out (where non-null).
  const void* add = nullptr;
  const void* norm_weight = nullptr;
  void* sum_out = nullptr;
  float norm_eps = 0.0f;
  // The input already scaled by its norm's weight (norm_squares non-null, norm_weight null): x is
  // sum * gamma as a GEMV's epilogue below wrote it, norm_squares[0 .. norm_square_count) the
  // partial sums of sum's squares that epilogue wrote; their total gives the 1 / rms that scales
  // the dot products (norm_eps with it). No add, no weight read: the input costs what a plain one does.
  const float* norm_squares = nullptr;
  int64_t norm_square_count = 0;
  // The residual add and the next RMSNorm's first half in the epilogue (residual non-null; not
  // gated, no bias, no RoPE, n a multiple of 4): y = residual + (x W^T rounded), rounded as
  // kernels::add_rms_norm rounds its sum (the residual stream's next value); scaled_out = y *
  // next_norm_weight, rounded (the next GEMV's input); squares_out[block] = the sum of the squares
  // of the block's rows of y ((n / 4) floats).
  const void* residual = nullptr;
  const void* next_norm_weight = nullptr;
  void* scaled_out = nullptr;
  float* squares_out = nullptr;
  GemvRopeIntoCache rope;  // q_out non-null: RoPE into the cache in the epilogue (y unused; not gated)
};
bool gemv_supported(const GemvArgs& args);
void gemv(const GemvArgs& args, Stream stream);

// Attention of one new token per sequence over the key/value cache where it lies, one launch
// (src/kernels/decode_attention.cu): out [b, H, d] = softmax(scale q k^T) v for q [b, H, d], each
// sequence's keys the rows key_starts[i] .. + key_counts[i] of the stores ([rows, G, d] with the
// given row strides, in elements; query head h reads group h / heads_per_group). bf16 / fp16, d 64
// or 128, at most 8 query heads a group. splits (decode_attention_splits) fixes the grid; with
// more than one they merge in a thread-block cluster where merge_in_cluster
// (decode_attention_merges_in_cluster: sm_90, up to 512 keys, one wave of blocks), else `partials` holds
// decode_attention_partial_floats() floats and `tickets` b * G int32 zeros, which the kernel
// leaves zero.
struct DecodeAttentionArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  const int32_t* key_starts;  // [b] (more entries are ignored)
  const int32_t* key_counts;  // [b]
  float* partials;
  int32_t* tickets;
  DType dtype;
  int64_t batch, heads, groups, heads_per_group, head_dim, k_row_stride, v_row_stride;
  int splits = 1;
  bool merge_in_cluster = false;
  float scale = 1.0f;
  bool overlap_previous = true;
};
// Whether the splits of `batch` sequences of at most `longest` keys over `groups` KV groups merge
// in a cluster (and are shorter): sm_90, at most 512 keys, the grid within one wave of blocks.
bool decode_attention_merges_in_cluster(int64_t longest, int64_t batch, int64_t groups);
// Key splits for sequences of at most `longest` keys (a CUDA graph: its bound on the keys).
int decode_attention_splits(int64_t longest, int64_t batch, int64_t groups);
int64_t decode_attention_partial_floats(const DecodeAttentionArgs& args);
bool decode_attention_supported(const DecodeAttentionArgs& args);
void decode_attention(const DecodeAttentionArgs& args, Stream stream);

// The MoE dispatcher's permutations (src/kernels/moe_permute.cu), rows of h channels
// (row-contiguous), fp32 arithmetic. A layer routes T tokens to k experts each; pair p = t k + j
// is token t's j-th choice.
// out[t] = sum over j of weights[t k + j] * src[slots[t k + j]] ([T, h]), skipping slots < 0;
// weights null: all 1.
void moe_gather_sum(const void* src, const int64_t* slots, const float* weights, void* out, int64_t tokens, int64_t topk,
                    int64_t h, DType dtype, Stream stream);
// out[r] = weights[pairs[r]] * src[pairs[r] / k] ([rows, h]); zeros where pairs[r] < 0 (padding);
// weights null: all 1.
void moe_expand_rows(const void* src, const int64_t* pairs, const float* weights, void* out, int64_t rows, int64_t topk,
                     int64_t h, DType dtype, Stream stream);
// out[p] = <a[p / k], b[slots[p]]> (fp32 [pairs]), 0 where slots[p] < 0.
void moe_pair_dots(const void* a, const void* b, const int64_t* slots, float* out, int64_t pairs, int64_t topk, int64_t h,
                   DType dtype, Stream stream);

// Scaled, saturating casts to FP8 (src/kernels/fp8_cast.cu; Transformer Engine's cast and
// cast-transpose): v = x * scale in fp32, saturated to the format's largest finite value and
// rounded to nearest even, for x [rows, cols] (row-contiguous). Written to out [rows, cols] and/or,
// in the same pass, to out_t [cols, rows] (the transposed copy a weight-gradient GEMM reads);
// either may be null.
enum class Fp8Format { E4M3, E5M2 };
// Where a cast's scale comes from and what the pass writes besides the FP8 values. Amaxes travel
// as the bits of non-negative fp32 values, which order as unsigned integers (a NaN above them all).
struct Fp8Scaling {
  const float* scale = nullptr;     // the scale (the delayed recipe's), or else
  const unsigned* amax = nullptr;   // current scaling: scale = fp8_max / amax, 1 where amax is 0 or not finite or the quotient overflows
  float fp8_max = 0.0f;
  float* scale_inv = nullptr;       // written, when given: 1 / scale
  unsigned* pool_amax = nullptr;    // when given: max |x| atomically maxed into it (the delayed recipe's history)
};
void fp8_cast(const void* x, int64_t rows, int64_t cols, DType dtype, const Fp8Scaling& scaling, Fp8Format format, void* out,
              void* out_t, Stream stream);
// max |x| over n elements atomically maxed into *amax (fp32 bits; the caller zeroes it first).
void fp8_amax(const void* x, int64_t n, DType dtype, unsigned* amax, Stream stream);

// The MoE experts' row-wise cast (src/kernels/fp8_group_cast.cu; src/fp8/grouped.h): each row of
// x [rows, cols] to e4m3 in out with the largest power-of-two scale keeping its max |x| within
// 448 (1 for a row of zeros or a non-finite max); scale_inv [rows] gets 1 / scale.
void fp8_row_cast(const void* x, int64_t rows, int64_t cols, DType dtype, void* out, float* scale_inv, Stream stream);
// The MoE experts' weight-gradient operand (src/kernels/fp8_group_cast.cu; src/fp8/grouped.h):
// x [rows, cols] whose rows come in `groups` runs, group g's ending at ends[g] (int32, device).
// fp8_group_column_amax maxes each (group, column)'s max |x| into amax [groups, cols] (fp32 bits,
// zeroed by the caller); fp8_group_column_cast writes x * scale[group, column] as e4m3 (saturating),
// transposed: row r of group g to column r + shift[g] of out_t [cols, padded_rows].
void fp8_group_column_amax(const void* x, int64_t rows, int64_t cols, DType dtype, const int* ends, int groups, unsigned* amax,
                           Stream stream);
void fp8_group_column_cast(const void* x, int64_t rows, int64_t cols, DType dtype, const int* ends, int groups, const float* scale,
                           const int64_t* shift, int64_t padded_rows, void* out_t, Stream stream);

}  // namespace megatron::kernels::cuda
