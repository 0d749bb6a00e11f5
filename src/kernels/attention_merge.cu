// Ring attention's log-sum-exp merge (src/context_parallel/partial_attention.h) in one pass: each
// accumulator row's output and log-sum-exp are read once, the block's row folded in, and both
// written back. ATen's composite takes ten launches and two passes over the fp32 output per block,
// which at short chunks (CP 8 at 32k: 2k tokens) cost as much as a fifth of the blocks' kernels.
// And the blocks combined once at the end (attention_combine; context_parallel/block_results.h):
// with at most four blocks a rank, each read once and the result written once in their dtype, no
// fp32 accumulator to start, fold into and cast.
#include "kernels/cuda_common.cuh"

#include <cmath>

namespace megatron::kernels::cuda {
namespace {

// One warp per (batch, head, row); its lanes stride over the value channels.
template <typename T>
__global__ void attention_merge_kernel(AttentionMergeArgs a) {
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t w = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; w < a.b * a.heads * a.rows; w += warps) {
    const int64_t row = w % a.rows, head = (w / a.rows) % a.heads, batch = w / (a.rows * a.heads);
    float* lse = a.lse + batch * a.lse_stride_b + head * a.lse_stride_h + row * a.lse_stride_row;
    const float mine = *lse;
    const float theirs = a.part_lse[batch * a.part_lse_stride_b + head * a.part_lse_stride_h + row * a.part_lse_stride_row];
    const float top = fmaxf(mine, theirs);
    // A row neither side saw a key in stays zero with log-sum-exp -inf.
    const bool empty = top == -INFINITY;
    const float merged = empty ? -INFINITY : top + log1pf(expf(-fabsf(mine - theirs)));
    const float kept = empty ? 0.0f : expf(mine - merged), added = empty ? 0.0f : expf(theirs - merged);
    float* out = a.out + batch * a.out_stride_b + head * a.out_stride_h + row * a.out_stride_row;
    const T* part = static_cast<const T*>(a.part_out) + batch * a.part_stride_b + head * a.part_stride_h + row * a.part_stride_row;
    for (int64_t col = lane; col < a.dv; col += 32) out[col] = out[col] * kept + to_float(part[col]) * added;
    __syncwarp();  // every lane has read the row's log-sum-exp before it changes
    if (lane == 0) *lse = merged;
  }
}

// One warp per (batch, head, row), as above; each part read once, out written once. The loops
// over the parts run to kMaxCombinedParts, unrolled, so that the per-part values stay in registers.
template <typename T>
__global__ void attention_combine_kernel(AttentionCombineArgs a) {
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  const bool by_lse = a.part[0].lse != nullptr;
  for (int64_t w = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; w < a.b * a.heads * a.rows; w += warps) {
    const int64_t row = w % a.rows, head = (w / a.rows) % a.heads, batch = w / (a.rows * a.heads);
    float weight[kMaxCombinedParts], lse[kMaxCombinedParts];
    const T* part[kMaxCombinedParts];
    float top = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxCombinedParts; ++i) {
      const AttentionCombineArgs::Part& p = a.part[i];
      const bool covers = i < a.parts && row >= p.first_row && row < p.first_row + p.rows;
      const int64_t r = row - p.first_row;
      lse[i] = !covers ? -INFINITY : by_lse ? p.lse[batch * p.lse_stride_b + head * p.lse_stride_h + r * p.lse_stride_row] : 0.0f;
      part[i] = covers ? static_cast<const T*>(p.out) + batch * p.stride_b + head * p.stride_h + r * p.stride_row : nullptr;
      top = fmaxf(top, lse[i]);
    }
    float merged = -INFINITY;
    if (top != -INFINITY) {
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxCombinedParts; ++i) sum += expf(lse[i] - top);
      merged = top + logf(sum);
    }
#pragma unroll
    for (int i = 0; i < kMaxCombinedParts; ++i) {
      // Without log-sum-exps every covering part counts once (lse 0, the sum not normalised).
      weight[i] = lse[i] == -INFINITY ? 0.0f : by_lse ? expf(lse[i] - merged) : 1.0f;
    }
    T* out = static_cast<T*>(a.out) + batch * a.out_stride_b + head * a.out_stride_h + row * a.out_stride_row;
    for (int64_t col = lane; col < a.dv; col += 32) {
      float total = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxCombinedParts; ++i) {
        if (weight[i] != 0.0f) total += to_float(part[i][col]) * weight[i];
      }
      out[col] = from_float<T>(total);
    }
    if (lane == 0 && a.out_lse) a.out_lse[batch * a.lse_stride_b + head * a.lse_stride_h + row * a.lse_stride_row] = merged;
  }
}

}  // namespace

void attention_combine(const AttentionCombineArgs& args, Stream stream) {
  const int64_t rows = args.b * args.heads * args.rows;
  if (rows == 0) return;
  constexpr int threads = 256;
  with_storage_type(args.dtype, [&](auto type) {
    using T = decltype(type);
    attention_combine_kernel<T><<<grid_for(rows * 32, threads), threads, 0, stream>>>(args);
  });
  check_launch("attention_combine");
}

void attention_merge(const AttentionMergeArgs& args, Stream stream) {
  const int64_t rows = args.b * args.heads * args.rows;
  if (rows == 0) return;
  constexpr int threads = 256;
  with_storage_type(args.part_dtype, [&](auto type) {
    using T = decltype(type);
    attention_merge_kernel<T><<<grid_for(rows * 32, threads), threads, 0, stream>>>(args);
  });
  check_launch("attention_merge");
}

}  // namespace megatron::kernels::cuda
