// Ring attention's log-sum-exp merge (src/context_parallel/partial_attention.h) in one pass: each
// accumulator row's output and log-sum-exp are read once, the block's row folded in, and both
// written back. ATen's composite takes ten launches and two passes over the fp32 output per block,
// which at short chunks (CP 8 at 32k: 2k tokens) cost as much as a fifth of the blocks' kernels.
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

}  // namespace

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
