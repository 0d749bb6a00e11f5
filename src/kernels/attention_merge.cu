// Ring attention's log-sum-exp merge (src/context_parallel/partial_attention.h) in one pass: each
// accumulator row's output and log-sum-exp are read once, the block's row folded in, and both
// written back. ATen's composite takes ten launches and two passes over the fp32 output per block,
// which at short chunks (CP 8 at 32k: 2k tokens) cost as much as a fifth of the blocks' kernels.
// And the blocks combined once at the end (attention_combine; context_parallel/block_results.h):
// with at most four blocks a rank, each read once and the result written once in their dtype, no
// fp32 accumulator to start, fold into and cast. And the key/value gradient shares added into the
// sums that travel the ring (add_key_value_grads), both in one launch.
//
// Rows are read and written in 16-byte packs where the rows' sizes, strides and pointers allow
// (a row of 64 bf16 channels: 8 threads of one pack each), one element a thread otherwise.
#include "kernels/cuda_common.cuh"

#include <algorithm>
#include <cmath>

namespace megatron::kernels::cuda {
namespace {

// The threads of a row: `lanes` (a power of two up to 32, so that a row's threads share a warp)
// side by side in x, each over every lanes-th pack of the row; 256 / lanes rows a block in y.
struct RowGrid {
  int lanes;
  dim3 block, grid;
  RowGrid(int64_t rows, int64_t packs_per_row) {
    lanes = 1;
    while (lanes < 32 && lanes * 2 <= packs_per_row) lanes *= 2;
    block = dim3(unsigned(lanes), unsigned(256 / lanes));
    grid = dim3(grid_for(rows, int(block.y)));
  }
};

// The rows a block takes in turns, blockDim.y of them a turn (row first() + threadIdx.y first,
// then step() on). The merge loops over the turns' first rows, so that every thread of a block
// runs the same number of turns (a row past the end does nothing) and a row's threads can meet
// at a __syncwarp; the combine, which never syncs, loops over its own rows.
struct RowTurns {
  int64_t rows;
  __device__ int64_t first() const { return int64_t(blockIdx.x) * blockDim.y; }
  __device__ int64_t step() const { return int64_t(gridDim.x) * blockDim.y; }
};

template <typename T, int N>
__device__ __forceinline__ void load_floats(const T* p, float (&out)[N]) {
  const Pack<T, N> pack = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = to_float(pack.v[j]);
}

template <typename T, int N>
__device__ __forceinline__ void store_floats(T* p, const float (&in)[N]) {
  Pack<T, N> pack;
#pragma unroll
  for (int j = 0; j < N; ++j) pack.v[j] = from_float<T>(in[j]);
  *reinterpret_cast<Pack<T, N>*>(p) = pack;
}

// Packs of N channels; the accumulator's out is fp32, the block's T.
template <typename T, int N>
__global__ void attention_merge_kernel(AttentionMergeArgs a) {
  const RowTurns turns{a.b * a.heads * a.rows};
  const int64_t packs = a.dv / N;
  for (int64_t base = turns.first(); base < turns.rows; base += turns.step()) {
    const int64_t w = base + threadIdx.y;
    const bool active = w < turns.rows;
    const int64_t row = active ? w % a.rows : 0, head = active ? (w / a.rows) % a.heads : 0, batch = active ? w / (a.rows * a.heads) : 0;
    float* lse = a.lse + batch * a.lse_stride_b + head * a.lse_stride_h + row * a.lse_stride_row;
    const float mine = active ? *lse : -INFINITY;
    const float theirs = active ? a.part_lse[batch * a.part_lse_stride_b + head * a.part_lse_stride_h + row * a.part_lse_stride_row]
                                : -INFINITY;
    const float top = fmaxf(mine, theirs);
    // A row neither side saw a key in stays zero with log-sum-exp -inf.
    const bool empty = top == -INFINITY;
    const float merged = empty ? -INFINITY : top + log1pf(expf(-fabsf(mine - theirs)));
    const float kept = empty ? 0.0f : expf(mine - merged), added = empty ? 0.0f : expf(theirs - merged);
    if (active) {
      float* out = a.out + batch * a.out_stride_b + head * a.out_stride_h + row * a.out_stride_row;
      const T* part = static_cast<const T*>(a.part_out) + batch * a.part_stride_b + head * a.part_stride_h + row * a.part_stride_row;
      for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
        float o[N], x[N];
        load_floats<float, N>(out + p * N, o);
        load_floats<T, N>(part + p * N, x);
#pragma unroll
        for (int j = 0; j < N; ++j) o[j] = o[j] * kept + x[j] * added;
        store_floats<float, N>(out + p * N, o);
      }
    }
    __syncwarp();  // every thread of the row has read its log-sum-exp before it changes
    if (active && threadIdx.x == 0) *lse = merged;
  }
}

// Packs of N channels of T; each part read once, out written once. The loops over the parts run
// to kMaxCombinedParts, unrolled, so that the per-part values stay in registers.
template <typename T, int N>
__global__ void attention_combine_kernel(AttentionCombineArgs a) {
  const RowTurns turns{a.b * a.heads * a.rows};
  const int64_t packs = a.dv / N;
  const bool by_lse = a.part[0].lse != nullptr;
  for (int64_t w = turns.first() + threadIdx.y; w < turns.rows; w += turns.step()) {
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
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      // Every part's pack loaded before any is summed: the loads are in flight together.
      float x[kMaxCombinedParts][N];
#pragma unroll
      for (int i = 0; i < kMaxCombinedParts; ++i) {
        if (weight[i] != 0.0f) {
          load_floats<T, N>(part[i] + p * N, x[i]);
        } else {
#pragma unroll
          for (int j = 0; j < N; ++j) x[i][j] = 0.0f;
        }
      }
      float total[N] = {};
#pragma unroll
      for (int i = 0; i < kMaxCombinedParts; ++i) {
#pragma unroll
        for (int j = 0; j < N; ++j) total[j] += x[i][j] * weight[i];
      }
      store_floats<T, N>(out + p * N, total);
    }
    if (threadIdx.x == 0 && a.out_lse) a.out_lse[batch * a.lse_stride_b + head * a.lse_stride_h + row * a.lse_stride_row] = merged;
  }
}

// One (tensor, batch, head) run a y-block; its packs of N over x, row by row. A run whose rows
// lie end to end in both tensors comes as one long row (rows == 1): no division a pack.
template <typename T, int N>
__global__ void add_key_value_grads_kernel(KeyValueGradsArgs a) {
  const int tensor = blockIdx.y < a.pair[0].b * a.pair[0].heads ? 0 : 1;
  const KeyValueGradsArgs::Part& t = a.pair[tensor];
  const int64_t run = blockIdx.y - (tensor == 0 ? 0 : a.pair[0].b * a.pair[0].heads);
  const int64_t batch = run / t.heads, head = run % t.heads;
  float* dst = t.sum + batch * t.sum_stride_b + head * t.sum_stride_h;
  const T* src = static_cast<const T*>(t.grad) + batch * t.grad_stride_b + head * t.grad_stride_h;
  const int64_t packs_per_row = t.dim / N, packs = t.rows * packs_per_row;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < packs; p += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = t.rows == 1 ? 0 : p / packs_per_row, channel = (p - row * packs_per_row) * N;
    float* d = dst + row * t.sum_stride_row + channel;
    float g[N], s[N];
    load_floats<T, N>(src + row * t.grad_stride_row + channel, g);
    if (a.overwrite) {
      store_floats<float, N>(d, g);
    } else {
      load_floats<float, N>(d, s);
#pragma unroll
      for (int j = 0; j < N; ++j) s[j] += g[j];
      store_floats<float, N>(d, s);
    }
  }
}

bool divisible(std::initializer_list<int64_t> values, int n) {
  for (int64_t v : values) {
    if (v % n != 0) return false;
  }
  return true;
}

}  // namespace

void attention_combine(const AttentionCombineArgs& args, Stream stream) {
  const int64_t rows = args.b * args.heads * args.rows;
  if (rows == 0) return;
  with_storage_type(args.dtype, [&](auto type) {
    using T = decltype(type);
    constexpr int n = kPack<T>;
    bool packed = divisible({args.dv, args.out_stride_b, args.out_stride_h, args.out_stride_row}, n) && aligned16(args.out);
    for (int i = 0; i < args.parts; ++i) {
      const AttentionCombineArgs::Part& p = args.part[i];
      packed = packed && divisible({p.stride_b, p.stride_h, p.stride_row}, n) && aligned16(p.out);
    }
    const RowGrid g(rows, packed ? args.dv / n : args.dv);
    if (packed) {
      attention_combine_kernel<T, n><<<g.grid, g.block, 0, stream>>>(args);
    } else {
      attention_combine_kernel<T, 1><<<g.grid, g.block, 0, stream>>>(args);
    }
  });
  check_launch("attention_combine");
}

void attention_merge(const AttentionMergeArgs& args, Stream stream) {
  const int64_t rows = args.b * args.heads * args.rows;
  if (rows == 0) return;
  with_storage_type(args.part_dtype, [&](auto type) {
    using T = decltype(type);
    constexpr int n = 4;  // 16 bytes of the fp32 accumulator, 8 or 16 of the block
    const bool packed = divisible({args.dv, args.out_stride_b, args.out_stride_h, args.out_stride_row, args.part_stride_b,
                                   args.part_stride_h, args.part_stride_row}, n) &&
                        aligned16(args.out) && aligned_to(args.part_out, n * sizeof(T));
    const RowGrid g(rows, packed ? args.dv / n : args.dv);
    if (packed) {
      attention_merge_kernel<T, n><<<g.grid, g.block, 0, stream>>>(args);
    } else {
      attention_merge_kernel<T, 1><<<g.grid, g.block, 0, stream>>>(args);
    }
  });
  check_launch("attention_merge");
}

void add_key_value_grads(const KeyValueGradsArgs& given, Stream stream) {
  KeyValueGradsArgs args = given;
  for (KeyValueGradsArgs::Part& t : args.pair) {
    if (t.rows > 1 && t.sum_stride_row == t.dim && t.grad_stride_row == t.dim) t.dim *= t.rows, t.rows = 1;  // one long row
  }
  const int64_t runs = args.pair[0].b * args.pair[0].heads + args.pair[1].b * args.pair[1].heads;
  const int64_t longest = std::max(args.pair[0].rows * args.pair[0].dim, args.pair[1].rows * args.pair[1].dim);
  if (runs == 0 || longest == 0) return;
  if (runs > 65535) throw std::runtime_error("add_key_value_grads: more than 65535 (batch, head) runs");
  constexpr int threads = 256, n = 4;  // 16 bytes of the fp32 sum, 8 or 16 of the gradient
  with_storage_type(args.dtype, [&](auto type) {
    using T = decltype(type);
    bool packed = true;
    for (const KeyValueGradsArgs::Part& t : args.pair) {
      packed = packed && divisible({t.dim, t.sum_stride_b, t.sum_stride_h, t.sum_stride_row, t.grad_stride_b, t.grad_stride_h, t.grad_stride_row}, n) &&
               aligned16(t.sum) && aligned_to(t.grad, n * sizeof(T));
    }
    if (packed) {
      add_key_value_grads_kernel<T, n><<<dim3(grid_for(longest / n, threads), unsigned(runs)), threads, 0, stream>>>(args);
    } else {
      add_key_value_grads_kernel<T, 1><<<dim3(grid_for(longest, threads), unsigned(runs)), threads, 0, stream>>>(args);
    }
  });
  check_launch("add_key_value_grads");
}

}  // namespace megatron::kernels::cuda
