// FP8 casts for the FP8 linear layers (src/fp8): one pass over the high-precision input writes
// the row-wise FP8 copy the forward / data-gradient GEMM reads and, when asked, its transpose, the
// column-wise copy the weight-gradient GEMM reads (cuBLAS's FP8 GEMMs take only the "TN" layout,
// so the weight gradient needs both operands transposed). ATen would spend a multiply, a clamp, a
// cast and a transpose copy on it, each a pass over memory.
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

constexpr int kTile = 32;  // the transposing kernel's tile: 32 x 32 elements, 32 x 8 threads

template <__nv_fp8_interpretation_t Format>
__device__ __forceinline__ __nv_fp8_storage_t to_fp8(float v) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, Format);
}

// |v| as bits that order as its magnitude does (a NaN above every number: it propagates).
__device__ __forceinline__ unsigned magnitude_bits(float v) { return __float_as_uint(fabsf(v)); }

// The scale of a cast: given, or from the amax as the tensorwise recipe computes it (the same
// IEEE division and reciprocal as the ATen path in src/fp8/quantize.cpp, so the two agree bit for bit).
__device__ __forceinline__ float scale_of(const Fp8Scaling& scaling) {
  if (scaling.scale != nullptr) return *scaling.scale;
  const float amax = __uint_as_float(*scaling.amax);
  const float scale = scaling.fp8_max / amax;
  return amax > 0.0f && isfinite(amax) && isfinite(scale) ? scale : 1.0f;
}

__device__ __forceinline__ int thread_in_block() { return threadIdx.y * blockDim.x + threadIdx.x; }

// The block's first thread writes 1 / scale when asked.
__device__ __forceinline__ void write_scale_inv(const Fp8Scaling& scaling, float s) {
  if (scaling.scale_inv != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && thread_in_block() == 0) *scaling.scale_inv = 1.0f / s;
}

// The block's largest `v` atomically maxed into *target: one atomic per block. Every thread of
// the block calls it (blocks of a multiple of 32 threads, at most 1024).
__device__ __forceinline__ void block_max_into(unsigned v, unsigned* target) {
  __shared__ unsigned scratch[32];
  for (int offset = 16; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(0xffffffff, v, offset));
  const int t = thread_in_block(), lane = t % 32, warp = t / 32, warps = (blockDim.x * blockDim.y) / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : 0u;
    for (int offset = 16; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(0xffffffff, v, offset));
    if (lane == 0) atomicMax(target, v);
  }
}

// Row-wise only: each work item casts N consecutive elements.
template <typename T, int N, __nv_fp8_interpretation_t Format>
__global__ void fp8_cast_kernel(const T* x, Fp8Scaling scaling, __nv_fp8_storage_t* out, int64_t n) {
  const float s = scale_of(scaling);
  write_scale_inv(scaling, s);
  unsigned m = 0;
  const int64_t items = n / N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items; i += int64_t(gridDim.x) * blockDim.x) {
    const Pack<T, N> v = *reinterpret_cast<const Pack<T, N>*>(x + i * N);
    Pack<__nv_fp8_storage_t, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float f = to_float(v.v[k]);
      m = max(m, magnitude_bits(f));
      o.v[k] = to_fp8<Format>(f * s);
    }
    *reinterpret_cast<Pack<__nv_fp8_storage_t, N>*>(out + i * N) = o;
  }
  if (scaling.pool_amax != nullptr) block_max_into(m, scaling.pool_amax);
}

// A 32 x 32 tile per block: read row by row (coalesced), written row-wise and, through shared
// memory, transposed (coalesced along the output's rows).
template <typename T, __nv_fp8_interpretation_t Format>
__global__ void fp8_cast_transpose_kernel(const T* x, Fp8Scaling scaling, __nv_fp8_storage_t* out,
                                          __nv_fp8_storage_t* out_t, int64_t rows, int64_t cols) {
  __shared__ __nv_fp8_storage_t tile[kTile][kTile + 4];
  const float s = scale_of(scaling);
  write_scale_inv(scaling, s);
  unsigned m = 0;
  const int64_t row0 = int64_t(blockIdx.y) * kTile, col0 = int64_t(blockIdx.x) * kTile;
  for (int r = threadIdx.y; r < kTile; r += blockDim.y) {
    const int64_t row = row0 + r, col = col0 + threadIdx.x;
    if (row < rows && col < cols) {
      const float f = to_float(x[row * cols + col]);
      m = max(m, magnitude_bits(f));
      const __nv_fp8_storage_t v = to_fp8<Format>(f * s);
      if (out != nullptr) out[row * cols + col] = v;
      tile[r][threadIdx.x] = v;
    }
  }
  __syncthreads();
  for (int c = threadIdx.y; c < kTile; c += blockDim.y) {
    const int64_t col = col0 + c, row = row0 + threadIdx.x;
    if (row < rows && col < cols) out_t[col * rows + row] = tile[threadIdx.x][c];
  }
  if (scaling.pool_amax != nullptr) block_max_into(m, scaling.pool_amax);
}

// The same for row and column counts that are multiples of 64, at memory speed: a 64 x 64 tile per
// block of 256 threads, read as vectors of 8 elements, written row-wise as vectors of 8 FP8 bytes
// and, from shared memory, transposed as vectors of 16.
constexpr int kWide = 64;

template <typename T, __nv_fp8_interpretation_t Format>
__global__ void fp8_cast_transpose_wide_kernel(const T* x, Fp8Scaling scaling, __nv_fp8_storage_t* out,
                                               __nv_fp8_storage_t* out_t, int64_t rows, int64_t cols) {
  __shared__ __nv_fp8_storage_t tile[kWide][kWide + 4];
  const float s = scale_of(scaling);
  write_scale_inv(scaling, s);
  unsigned m = 0;
  const int64_t row0 = int64_t(blockIdx.y) * kWide, col0 = int64_t(blockIdx.x) * kWide;
  for (int i = threadIdx.x; i < kWide * kWide / 8; i += blockDim.x) {
    const int r = i / (kWide / 8), c = (i % (kWide / 8)) * 8;
    const Pack<T, 8> v = *reinterpret_cast<const Pack<T, 8>*>(x + (row0 + r) * cols + col0 + c);
    Pack<__nv_fp8_storage_t, 8> o;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float f = to_float(v.v[k]);
      m = max(m, magnitude_bits(f));
      o.v[k] = to_fp8<Format>(f * s);
      tile[r][c + k] = o.v[k];
    }
    if (out != nullptr) *reinterpret_cast<Pack<__nv_fp8_storage_t, 8>*>(out + (row0 + r) * cols + col0 + c) = o;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kWide * kWide / 16; i += blockDim.x) {
    const int c = i / (kWide / 16), r = (i % (kWide / 16)) * 16;
    Pack<__nv_fp8_storage_t, 16> o;
#pragma unroll
    for (int k = 0; k < 16; ++k) o.v[k] = tile[r + k][c];
    *reinterpret_cast<Pack<__nv_fp8_storage_t, 16>*>(out_t + (col0 + c) * rows + row0 + r) = o;
  }
  if (scaling.pool_amax != nullptr) block_max_into(m, scaling.pool_amax);
}

// max |x|: N elements per load, the tail one by one, one atomic per block.
template <typename T, int N>
__global__ void amax_kernel(const T* x, int64_t n, unsigned* amax) {
  unsigned m = 0;
  const int64_t items = n / N, stride = int64_t(gridDim.x) * blockDim.x, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (int64_t i = first; i < items; i += stride) {
    const Pack<T, N> v = *reinterpret_cast<const Pack<T, N>*>(x + i * N);
#pragma unroll
    for (int k = 0; k < N; ++k) m = max(m, magnitude_bits(to_float(v.v[k])));
  }
  for (int64_t i = items * N + first; i < n; i += stride) m = max(m, magnitude_bits(to_float(x[i])));
  block_max_into(m, amax);
}

template <__nv_fp8_interpretation_t Format>
void launch(const void* x, int64_t rows, int64_t cols, DType dtype, const Fp8Scaling& scaling, void* out, void* out_t,
            Stream stream) {
  auto* o = static_cast<__nv_fp8_storage_t*>(out);
  auto* ot = static_cast<__nv_fp8_storage_t*>(out_t);
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    if (ot == nullptr) {
      constexpr int threads = 256;
      // Packs of 8 elements (16 bytes of bf16 in, 8 bytes out) when every pointer allows it.
      const bool packed = (rows * cols) % 8 == 0 && reinterpret_cast<uintptr_t>(x) % (8 * sizeof(T)) == 0 &&
                          reinterpret_cast<uintptr_t>(o) % 8 == 0;
      if (packed) {
        fp8_cast_kernel<T, 8, Format><<<grid_for(rows * cols / 8, threads), threads, 0, stream>>>(
            static_cast<const T*>(x), scaling, o, rows * cols);
      } else {
        fp8_cast_kernel<T, 1, Format><<<grid_for(rows * cols, threads), threads, 0, stream>>>(
            static_cast<const T*>(x), scaling, o, rows * cols);
      }
    } else if (rows % kWide == 0 && cols % kWide == 0 && rows / kWide <= 65535 &&
               reinterpret_cast<uintptr_t>(x) % (8 * sizeof(T)) == 0 && reinterpret_cast<uintptr_t>(o) % 8 == 0 &&
               reinterpret_cast<uintptr_t>(ot) % 16 == 0) {
      const dim3 grid(unsigned(cols / kWide), unsigned(rows / kWide));
      fp8_cast_transpose_wide_kernel<T, Format><<<grid, 256, 0, stream>>>(static_cast<const T*>(x), scaling, o, ot, rows, cols);
    } else {
      if ((rows + kTile - 1) / kTile > 65535) throw std::runtime_error("fp8_cast: more than 2,097,120 rows to transpose");
      const dim3 block(kTile, 8);
      const dim3 grid(unsigned((cols + kTile - 1) / kTile), unsigned((rows + kTile - 1) / kTile));
      fp8_cast_transpose_kernel<T, Format><<<grid, block, 0, stream>>>(static_cast<const T*>(x), scaling, o, ot, rows, cols);
    }
  });
}

}  // namespace

void fp8_cast(const void* x, int64_t rows, int64_t cols, DType dtype, const Fp8Scaling& scaling, Fp8Format format, void* out,
              void* out_t, Stream stream) {
  if (rows == 0 || cols == 0 || (out == nullptr && out_t == nullptr)) return;
  if (format == Fp8Format::E4M3) {
    launch<__NV_E4M3>(x, rows, cols, dtype, scaling, out, out_t, stream);
  } else {
    launch<__NV_E5M2>(x, rows, cols, dtype, scaling, out, out_t, stream);
  }
  check_launch("fp8_cast");
}

void fp8_amax(const void* x, int64_t n, DType dtype, unsigned* amax, Stream stream) {
  if (n == 0) return;
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    constexpr int threads = 512;
    // A few blocks per SM are enough to stream memory; more would only add atomics on one word.
    const unsigned blocks = std::min(grid_for(n / 8 + 1, threads), 1024u);
    if (n % 8 == 0 && reinterpret_cast<uintptr_t>(x) % (8 * sizeof(T)) == 0) {
      amax_kernel<T, 8><<<blocks, threads, 0, stream>>>(static_cast<const T*>(x), n, amax);
    } else {
      amax_kernel<T, 1><<<blocks, threads, 0, stream>>>(static_cast<const T*>(x), n, amax);
    }
  });
  check_launch("fp8_amax");
}

}  // namespace megatron::kernels::cuda
