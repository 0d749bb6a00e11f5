// The MoE experts' FP8 casts (src/fp8/grouped.h), all with power-of-two scales:
// - row-wise: each row of x [rows, cols] with the largest power of two that keeps its largest
//   magnitude within e4m3's 448 (the forward's and data gradient's operands, and the weights);
//   ATen spends an abs, a row max, the scale, a multiply and a cast on it, five passes; here the
//   row is read for its max and again (from cache) for the cast, by one block.
// - the weight gradient's operands: the rows of x come in groups (one per expert, group g's rows
//   ending at ends[g]); each group's columns get a scale of their own, and the cast values are
//   written transposed, each group's rows starting at an aligned column of the output. ATen
//   spends an abs, a segmented max, a gather of the scales, a multiply, a cast, a scatter and a
//   transpose on it; here it is two passes over x.
#include <cuda_fp8.h>

#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = 64;  // the amax kernel's rows per block
constexpr int kRowThreads = 256;   // the row cast's block: one row each

// e4m3's scale for a largest magnitude: the largest power of two not above 448 / amax (the same
// IEEE division and exponent bits as fp8::power_of_two_floor(scale_from_amax(...))), 1 where
// amax is 0 or not finite (a NaN's bits order above infinity's).
__device__ __forceinline__ float e4m3_power_of_two_scale(unsigned amax_bits) {
  const float amax = __uint_as_float(amax_bits);
  float s = 448.0f / amax;
  if (!(amax > 0.0f && isfinite(amax) && isfinite(s))) s = 1.0f;
  return __uint_as_float(__float_as_uint(s) & 0x7f800000u);
}

// One row per block: the row's max |x| (a block reduction of magnitude bits), its scale, then
// the row cast; N elements per load.
template <typename T, int N>
__global__ void row_cast_kernel(const T* x, int64_t cols, __nv_fp8_storage_t* out, float* scale_inv) {
  __shared__ unsigned warp_max[kRowThreads / 32];
  __shared__ float row_scale;
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  unsigned m = 0;
  for (int64_t c = int64_t(threadIdx.x) * N; c < cols; c += int64_t(blockDim.x) * N) {
    const Pack<T, N> v = *reinterpret_cast<const Pack<T, N>*>(xr + c);
#pragma unroll
    for (int k = 0; k < N; ++k) m = max(m, __float_as_uint(fabsf(to_float(v.v[k]))));
  }
  for (int offset = 16; offset > 0; offset /= 2) m = max(m, __shfl_xor_sync(0xffffffff, m, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned all = 0;
    for (int w = 0; w < int(blockDim.x / 32); ++w) all = max(all, warp_max[w]);
    row_scale = e4m3_power_of_two_scale(all);
    scale_inv[row] = 1.0f / row_scale;
  }
  __syncthreads();
  const float s = row_scale;
  __nv_fp8_storage_t* o = out + row * cols;
  for (int64_t c = int64_t(threadIdx.x) * N; c < cols; c += int64_t(blockDim.x) * N) {
    const Pack<T, N> v = *reinterpret_cast<const Pack<T, N>*>(xr + c);
    Pack<__nv_fp8_storage_t, N> q;
#pragma unroll
    for (int k = 0; k < N; ++k) q.v[k] = __nv_cvt_float_to_fp8(to_float(v.v[k]) * s, __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<Pack<__nv_fp8_storage_t, N>*>(o + c) = q;
  }
}
constexpr int kTile = 32;          // the cast kernel's tile: 32 x 32 elements, 32 x 8 threads

// The group of row r: the first g with ends[g] > r (rows past the last end: the last group).
__device__ __forceinline__ int group_of(const int* ends, int groups, int64_t r) {
  int lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (int64_t(ends[mid]) > r) hi = mid; else lo = mid + 1;
  }
  return lo;
}

// Each thread one column, down kRowsPerBlock rows: a running max per group, flushed with one
// atomic when the group changes (groups are contiguous runs of rows) and at the end.
template <typename T>
__global__ void group_column_amax_kernel(const T* x, int64_t rows, int64_t cols, const int* ends, int groups, unsigned* amax) {
  const int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t row0 = int64_t(blockIdx.y) * kRowsPerBlock;
  if (col >= cols || row0 >= rows) return;
  const int64_t last = min(rows, row0 + kRowsPerBlock);
  int g = group_of(ends, groups, row0);
  unsigned m = 0;
  for (int64_t r = row0; r < last; ++r) {
    while (g + 1 < groups && int64_t(ends[g]) <= r) {
      if (m != 0) atomicMax(amax + int64_t(g) * cols + col, m);
      m = 0;
      ++g;
    }
    m = max(m, __float_as_uint(fabsf(to_float(x[r * cols + col]))));
  }
  if (m != 0) atomicMax(amax + int64_t(g) * cols + col, m);
}

// A 32 x 32 tile per block: each row's group and destination found once, the values scaled by
// their (group, column) scale and cast, written transposed through shared memory.
template <typename T>
__global__ void group_column_cast_kernel(const T* x, int64_t rows, int64_t cols, const int* ends, int groups, const float* scale,
                                         const int64_t* shift, int64_t padded_rows, __nv_fp8_storage_t* out_t) {
  __shared__ __nv_fp8_storage_t tile[kTile][kTile + 4];
  __shared__ int group[kTile];
  __shared__ int64_t destination[kTile];
  const int64_t row0 = int64_t(blockIdx.y) * kTile, col0 = int64_t(blockIdx.x) * kTile;
  if (threadIdx.y == 0 && row0 + threadIdx.x < rows) {
    const int g = group_of(ends, groups, row0 + threadIdx.x);
    group[threadIdx.x] = g;
    destination[threadIdx.x] = row0 + threadIdx.x + shift[g];
  }
  __syncthreads();
  for (int r = threadIdx.y; r < kTile; r += blockDim.y) {
    const int64_t row = row0 + r, col = col0 + threadIdx.x;
    if (row < rows && col < cols) {
      const float v = to_float(x[row * cols + col]) * scale[int64_t(group[r]) * cols + col];
      tile[r][threadIdx.x] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    }
  }
  __syncthreads();
  for (int c = threadIdx.y; c < kTile; c += blockDim.y) {
    const int64_t col = col0 + c, row = row0 + threadIdx.x;
    if (row < rows && col < cols) out_t[col * padded_rows + destination[threadIdx.x]] = tile[threadIdx.x][c];
  }
}

}  // namespace

void fp8_row_cast(const void* x, int64_t rows, int64_t cols, DType dtype, void* out, float* scale_inv, Stream stream) {
  if (rows == 0) return;
  if (rows > 2147483647LL) throw std::runtime_error("fp8_row_cast: more than 2^31 - 1 rows");
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    auto* o = static_cast<__nv_fp8_storage_t*>(out);
    // Packs of 8 elements when every row starts on one (16 bytes of bf16 in, 8 bytes out).
    const bool packed = cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % (8 * sizeof(T)) == 0 && reinterpret_cast<uintptr_t>(o) % 8 == 0;
    if (packed) {
      row_cast_kernel<T, 8><<<unsigned(rows), kRowThreads, 0, stream>>>(static_cast<const T*>(x), cols, o, scale_inv);
    } else {
      row_cast_kernel<T, 1><<<unsigned(rows), kRowThreads, 0, stream>>>(static_cast<const T*>(x), cols, o, scale_inv);
    }
  });
  check_launch("fp8_row_cast");
}

void fp8_group_column_amax(const void* x, int64_t rows, int64_t cols, DType dtype, const int* ends, int groups, unsigned* amax,
                           Stream stream) {
  if (rows == 0 || cols == 0 || groups == 0) return;
  constexpr int threads = 128;
  const dim3 grid(unsigned((cols + threads - 1) / threads), unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock));
  if (grid.y > 65535) throw std::runtime_error("fp8_group_column_amax: more than 4,194,240 rows");
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    group_column_amax_kernel<T><<<grid, threads, 0, stream>>>(static_cast<const T*>(x), rows, cols, ends, groups, amax);
  });
  check_launch("fp8_group_column_amax");
}

void fp8_group_column_cast(const void* x, int64_t rows, int64_t cols, DType dtype, const int* ends, int groups, const float* scale,
                           const int64_t* shift, int64_t padded_rows, void* out_t, Stream stream) {
  if (rows == 0 || cols == 0 || groups == 0) return;
  const dim3 block(kTile, 8);
  const dim3 grid(unsigned((cols + kTile - 1) / kTile), unsigned((rows + kTile - 1) / kTile));
  if (grid.y > 65535) throw std::runtime_error("fp8_group_column_cast: more than 2,097,120 rows");
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    group_column_cast_kernel<T><<<grid, block, 0, stream>>>(static_cast<const T*>(x), rows, cols, ends, groups, scale, shift,
                                                          padded_rows, static_cast<__nv_fp8_storage_t*>(out_t));
  });
  check_launch("fp8_group_column_cast");
}

}  // namespace megatron::kernels::cuda
