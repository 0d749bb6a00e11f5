// The MoE dispatcher's token permutations as gathers (--moe-permute-fusion): tokens to the
// experts' rows and the weighted results back, each output element written by one thread from
// the inputs it needs, so no pass scatters with atomics and every sum runs in a fixed order
// (deterministic backward). ATen's composite needs an index_select, a zero-filled [T k, h]
// tensor, an index_copy, a product and a sum for the same combine; here it is one pass.
#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

// Work item i covers N consecutive channels of output row i / (h / N).
template <typename T, int N>
__global__ void moe_gather_sum_kernel(const T* src, const int64_t* slots, const float* weights, T* out, int64_t tokens,
                                      int64_t topk, int64_t h) {
  const int64_t per_row = h / N, items = tokens * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_row, col = (i % per_row) * N;
    float acc[N] = {};
    for (int64_t j = 0; j < topk; ++j) {
      const int64_t row = slots[t * topk + j];
      if (row < 0) continue;
      const float w = weights != nullptr ? weights[t * topk + j] : 1.0f;
      const Pack<T, N> x = *reinterpret_cast<const Pack<T, N>*>(src + row * h + col);
#pragma unroll
      for (int k = 0; k < N; ++k) acc[k] += w * to_float(x.v[k]);
    }
    Pack<T, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = from_float<T>(acc[k]);
    *reinterpret_cast<Pack<T, N>*>(out + t * h + col) = o;
  }
}

template <typename T, int N>
__global__ void moe_expand_rows_kernel(const T* src, const int64_t* pairs, const float* weights, T* out, int64_t rows,
                                       int64_t topk, int64_t h) {
  const int64_t per_row = h / N, items = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, col = (i % per_row) * N;
    const int64_t pair = pairs[r];
    Pack<T, N> o;
    if (pair < 0) {  // a padding row
#pragma unroll
      for (int k = 0; k < N; ++k) o.v[k] = from_float<T>(0.0f);
    } else if (weights == nullptr) {
      o = *reinterpret_cast<const Pack<T, N>*>(src + (pair / topk) * h + col);
    } else {
      const float w = weights[pair];
      const Pack<T, N> x = *reinterpret_cast<const Pack<T, N>*>(src + (pair / topk) * h + col);
#pragma unroll
      for (int k = 0; k < N; ++k) o.v[k] = from_float<T>(w * to_float(x.v[k]));
    }
    *reinterpret_cast<Pack<T, N>*>(out + r * h + col) = o;
  }
}

// One warp per pair.
template <typename T, int N>
__global__ void moe_pair_dots_kernel(const T* a, const T* b, const int64_t* slots, float* out, int64_t pairs,
                                     int64_t topk, int64_t h) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t p = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; p < pairs; p += warps) {
    const int64_t row = slots[p];
    float sum = 0.0f;
    if (row >= 0) {
      const T* x = a + (p / topk) * h;
      const T* y = b + row * h;
      for (int64_t col = int64_t(lane) * N; col < h; col += 32 * N) {
        const Pack<T, N> u = *reinterpret_cast<const Pack<T, N>*>(x + col);
        const Pack<T, N> v = *reinterpret_cast<const Pack<T, N>*>(y + col);
#pragma unroll
        for (int k = 0; k < N; ++k) sum += to_float(u.v[k]) * to_float(v.v[k]);
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
    if (lane == 0) out[p] = sum;
  }
}

}  // namespace

void moe_gather_sum(const void* src, const int64_t* slots, const float* weights, void* out, int64_t tokens, int64_t topk,
                    int64_t h, DType dtype, Stream stream) {
  if (tokens == 0 || h == 0) return;
  constexpr int threads = 256;
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    with_pack<T>(h, {src, out}, [&](auto pack) {
      constexpr int N = decltype(pack)::value;
      moe_gather_sum_kernel<T, N><<<grid_for(tokens * h / N, threads), threads, 0, stream>>>(
          static_cast<const T*>(src), slots, weights, static_cast<T*>(out), tokens, topk, h);
    });
  });
  check_launch("moe_gather_sum");
}

void moe_expand_rows(const void* src, const int64_t* pairs, const float* weights, void* out, int64_t rows, int64_t topk,
                     int64_t h, DType dtype, Stream stream) {
  if (rows == 0 || h == 0) return;
  constexpr int threads = 256;
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    with_pack<T>(h, {src, out}, [&](auto pack) {
      constexpr int N = decltype(pack)::value;
      moe_expand_rows_kernel<T, N><<<grid_for(rows * h / N, threads), threads, 0, stream>>>(
          static_cast<const T*>(src), pairs, weights, static_cast<T*>(out), rows, topk, h);
    });
  });
  check_launch("moe_expand_rows");
}

void moe_pair_dots(const void* a, const void* b, const int64_t* slots, float* out, int64_t pairs, int64_t topk, int64_t h,
                   DType dtype, Stream stream) {
  if (pairs == 0) return;
  constexpr int threads = 256;
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    with_pack<T>(h, {a, b}, [&](auto pack) {
      constexpr int N = decltype(pack)::value;
      moe_pair_dots_kernel<T, N><<<grid_for(pairs * 32, threads), threads, 0, stream>>>(
          static_cast<const T*>(a), static_cast<const T*>(b), slots, out, pairs, topk, h);
    });
  });
  check_launch("moe_pair_dots");
}

}  // namespace megatron::kernels::cuda
