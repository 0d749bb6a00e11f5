// Ring attention's log-sum-exp merge (src/context_parallel/partial_attention.h) in one pass: each
// accumulator row's output and log-sum-exp are read once, the block's row folded in, and both
// written back. ATen's composite takes ten launches and two passes over the fp32 output per block,
// which at short chunks (CP 8 at 32k: 2k tokens) cost as much as a fifth of the blocks' kernels.
// And the combination of up to kMaxRowBlocks blocks at once (each read once, the result written
// once), which the ring uses instead of a merge per block.
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

// Element `col` of a block's row, whatever its storage type.
__device__ __forceinline__ float element(const RowBlock& blk, int64_t offset) {
  switch (blk.dtype) {
    case DType::BFloat16: return to_float(static_cast<const __nv_bfloat16*>(blk.values)[offset]);
    case DType::Float16: return to_float(static_cast<const __half*>(blk.values)[offset]);
    default: return static_cast<const float*>(blk.values)[offset];
  }
}

// One warp per (batch, head, row) of the output; the blocks covering that row combined.
template <typename T>
__global__ void combine_row_blocks_kernel(RowBlockCombineArgs a) {
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t w = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; w < a.b * a.heads * a.rows; w += warps) {
    const int64_t row = w % a.rows, head = (w / a.rows) % a.heads, batch = w / (a.rows * a.heads);
    float weight[kMaxRowBlocks];
    int64_t at[kMaxRowBlocks];  // the row's offset in each block; -1 where the block does not cover it
    float top = -INFINITY;
    // Loops to the constant bound keep weight[] and at[] in registers.
#pragma unroll
    for (int i = 0; i < kMaxRowBlocks; ++i) {
      const RowBlock& blk = a.blocks[i];
      const int64_t r = row - blk.first_row;
      at[i] = i < a.count && r >= 0 && r < blk.rows ? batch * blk.stride_b + head * blk.stride_h + r * blk.stride_row : -1;
      weight[i] = 1.0f;
      if (a.weighted && at[i] >= 0) {
        weight[i] = blk.lse[batch * blk.lse_stride_b + head * blk.lse_stride_h + r * blk.lse_stride_row];
        top = fmaxf(top, weight[i]);
      }
    }
    float lse = -INFINITY;
    if (a.weighted) {
      // exp(lse_i - lse) with lse = top + log(sum exp(lse_i - top)); a row no block saw a key in stays zero.
      float total = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxRowBlocks; ++i) {
        weight[i] = at[i] >= 0 && top != -INFINITY ? expf(weight[i] - top) : 0.0f;
        total += weight[i];
      }
      if (top != -INFINITY) {
        lse = top + logf(total);
#pragma unroll
        for (int i = 0; i < kMaxRowBlocks; ++i) weight[i] /= total;
      }
    }
    T* out = static_cast<T*>(a.out) + batch * a.out_stride_b + head * a.out_stride_h + row * a.out_stride_row;
    for (int64_t col = lane; col < a.dv; col += 32) {
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kMaxRowBlocks; ++i) {
        if (at[i] >= 0 && weight[i] != 0.0f) sum += weight[i] * element(a.blocks[i], at[i] + col);
      }
      out[col] = from_float<T>(sum);
    }
    if (a.out_lse != nullptr && lane == 0) a.out_lse[batch * a.out_lse_stride_b + head * a.out_lse_stride_h + row * a.out_lse_stride_row] = lse;
  }
}

}  // namespace

void combine_row_blocks(const RowBlockCombineArgs& args, Stream stream) {
  const int64_t rows = args.b * args.heads * args.rows;
  if (rows == 0) return;
  if (args.count < 1 || args.count > kMaxRowBlocks) throw std::runtime_error("combine_row_blocks: 1 to kMaxRowBlocks blocks");
  constexpr int threads = 256;
  with_storage_type(args.out_dtype, [&](auto type) {
    using T = decltype(type);
    combine_row_blocks_kernel<T><<<grid_for(rows * 32, threads), threads, 0, stream>>>(args);
  });
  check_launch("combine_row_blocks");
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
