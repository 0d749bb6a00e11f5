// RMSNorm forward (optionally with the residual add before it) and backward. One block per row
// in the forward, each thread holding one 16-byte pack of the row in registers, so a row is read
// once and written once. The backward walks rows with a grid-stride loop, each thread keeping
// its columns' weight-gradient partial sums in registers across rows (one partial row per block
// instead of a [rows, h] intermediate).
#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

int threads_for(int64_t packs) { return static_cast<int>((packs + 31) / 32 * 32); }

template <typename T>
__global__ void rms_norm_forward_kernel(const T* a, const T* b, const T* weight, T* sum, T* y, float* rstd, int64_t h,
                                        float eps) {
  constexpr int N = kPack<T>;
  __shared__ float scratch[32];
  const int64_t packs = h / N;
  const bool active = threadIdx.x < packs;
  const int64_t at = blockIdx.x * packs + threadIdx.x;  // this thread's pack in the flat tensor
  // Launched to overlap the kernel before (the norms of a decode step, one block each).
  let_next_kernel_start();
  wait_for_kernel_before();
  float x[N];
  float squares = 0.0f;
  if (active) {
    Pack<T, N> pa = reinterpret_cast<const Pack<T, N>*>(a)[at];
    if (b != nullptr) {
      // The residual sum is rounded to the storage type first, as the unfused add would, and the
      // norm reads that rounded value.
      const Pack<T, N> pb = reinterpret_cast<const Pack<T, N>*>(b)[at];
#pragma unroll
      for (int k = 0; k < N; ++k) pa.v[k] = from_float<T>(to_float(pa.v[k]) + to_float(pb.v[k]));
      reinterpret_cast<Pack<T, N>*>(sum)[at] = pa;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) {
      x[k] = to_float(pa.v[k]);
      squares += x[k] * x[k];
    }
  }
  const float r = rsqrtf(block_sum(squares, scratch) / static_cast<float>(h) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  if (!active) return;
  const Pack<T, N> w = reinterpret_cast<const Pack<T, N>*>(weight)[threadIdx.x];
  Pack<T, N> out;
#pragma unroll
  for (int k = 0; k < N; ++k) out.v[k] = from_float<T>(x[k] * r * to_float(w.v[k]));
  reinterpret_cast<Pack<T, N>*>(y)[at] = out;
}

template <typename T>
__global__ void rms_norm_backward_kernel(const T* grad_y, const T* x, const T* weight, const float* rstd,
                                         const T* grad_extra, T* grad_x, float* weight_partial, int64_t rows,
                                         int64_t h) {
  constexpr int N = kPack<T>;
  __shared__ float scratch[32];
  const int64_t packs = h / N;
  const bool active = threadIdx.x < packs;
  float w[N], dw[N];
  if (active) {
    const Pack<T, N> wp = reinterpret_cast<const Pack<T, N>*>(weight)[threadIdx.x];
#pragma unroll
    for (int k = 0; k < N; ++k) w[k] = to_float(wp.v[k]), dw[k] = 0.0f;
  }
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t at = row * packs + threadIdx.x;
    const float r = rstd[row];
    float xhat[N], wdy[N];
    float dot = 0.0f;
    if (active) {
      const Pack<T, N> dyp = reinterpret_cast<const Pack<T, N>*>(grad_y)[at];
      const Pack<T, N> xp = reinterpret_cast<const Pack<T, N>*>(x)[at];
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float dy = to_float(dyp.v[k]);
        xhat[k] = to_float(xp.v[k]) * r;
        wdy[k] = w[k] * dy;
        dot += wdy[k] * xhat[k];
        dw[k] += dy * xhat[k];
      }
    }
    const float mean_dot = block_sum(dot, scratch) / static_cast<float>(h);
    if (!active) continue;
    float extra[N] = {};
    if (grad_extra != nullptr) {
      const Pack<T, N> e = reinterpret_cast<const Pack<T, N>*>(grad_extra)[at];
#pragma unroll
      for (int k = 0; k < N; ++k) extra[k] = to_float(e.v[k]);
    }
    Pack<T, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = from_float<T>(r * (wdy[k] - xhat[k] * mean_dot) + extra[k]);
    reinterpret_cast<Pack<T, N>*>(grad_x)[at] = out;
  }
  if (!active) return;
  float* partial = weight_partial + blockIdx.x * h + threadIdx.x * N;
#pragma unroll
  for (int k = 0; k < N; ++k) partial[k] = dw[k];
}

// grad_weight[j] = sum over rows r of partial[r][j]. A block takes 32 columns; its 32 x 16
// threads read 32 consecutive floats per row (coalesced), 16 rows at a time, then sum the 16
// partial column sums in shared memory.
constexpr int kColumnSumRows = 16;

template <typename T>
__global__ void column_sum_kernel(const float* partial, T* out, int64_t rows, int64_t h) {
  __shared__ float sums[kColumnSumRows][33];
  const int64_t j = blockIdx.x * 32 + threadIdx.x;
  float sum = 0.0f;
  if (j < h) {
    for (int64_t r = threadIdx.y; r < rows; r += kColumnSumRows) sum += partial[r * h + j];
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || j >= h) return;
  for (int k = 1; k < kColumnSumRows; ++k) sum += sums[k][threadIdx.x];
  out[j] = from_float<T>(sum);
}

int multiprocessors() {
  static const int count = [] {
    int device = 0, n = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    return n > 0 ? n : 108;
  }();
  return count;
}

}  // namespace

bool rms_norm_supported(int64_t h, DType dtype) {
  const int64_t pack = dtype == DType::Float32 ? 4 : 8;
  return h % pack == 0 && h / pack >= 32 && h / pack <= 1024;
}

void rms_norm_forward(const void* a, const void* b, const void* weight, void* sum, void* y, float* rstd, int64_t rows,
                      int64_t h, float eps, DType dtype, Stream stream) {
  if (rows == 0) return;
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    launch_overlapping("rms_norm_forward", true, rms_norm_forward_kernel<T>, static_cast<unsigned>(rows), threads_for(h / kPack<T>), 0,
                       stream,
                       static_cast<const T*>(a), static_cast<const T*>(b), static_cast<const T*>(weight),
                       static_cast<T*>(sum), static_cast<T*>(y), rstd, h, eps);
  });
}

int64_t rms_norm_backward_blocks(int64_t rows) {
  const int64_t wanted = int64_t(multiprocessors()) * 4;
  return rows < wanted ? (rows > 0 ? rows : 1) : wanted;
}

void rms_norm_backward(const void* grad_y, const void* x, const void* weight, const float* rstd, const void* grad_extra,
                       void* grad_x, void* grad_weight, float* workspace, int64_t rows, int64_t h, DType dtype,
                       Stream stream) {
  const int64_t blocks = rms_norm_backward_blocks(rows);
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    rms_norm_backward_kernel<T><<<static_cast<unsigned>(blocks), threads_for(h / kPack<T>), 0, stream>>>(
        static_cast<const T*>(grad_y), static_cast<const T*>(x), static_cast<const T*>(weight), rstd,
        static_cast<const T*>(grad_extra), static_cast<T*>(grad_x), workspace, rows, h);
    column_sum_kernel<T><<<static_cast<unsigned>((h + 31) / 32), dim3(32, kColumnSumRows), 0, stream>>>(
        workspace, static_cast<T*>(grad_weight), blocks, h);
  });
  check_launch("rms_norm_backward");
}

}  // namespace megatron::kernels::cuda
