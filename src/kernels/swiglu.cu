// Fused SwiGLU: silu(gate) * up in one pass forward and both input gradients in one pass
// backward, saving only the [gate | up] input (ATen's composite runs four kernels each way and
// keeps silu(gate) as well). Rows whose width is a multiple of a 16-byte pack move in packs.
#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

// Work item i covers N consecutive output channels: row i / (f / N), channels (i % (f / N)) * N.
template <typename T, int N>
__global__ void swiglu_forward_kernel(const T* in, T* out, int64_t rows, int64_t f) {
  const int64_t per_row = f / N, items = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row, col = (i % per_row) * N;
    const Pack<T, N> g = *reinterpret_cast<const Pack<T, N>*>(in + row * 2 * f + col);
    const Pack<T, N> u = *reinterpret_cast<const Pack<T, N>*>(in + row * 2 * f + f + col);
    Pack<T, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float x = to_float(g.v[k]);
      o.v[k] = from_float<T>(x * sigmoid(x) * to_float(u.v[k]));
    }
    *reinterpret_cast<Pack<T, N>*>(out + row * f + col) = o;
  }
}

template <typename T, int N>
__global__ void swiglu_backward_kernel(const T* grad_out, const T* in, T* grad_in, int64_t rows, int64_t f) {
  const int64_t per_row = f / N, items = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / per_row, col = (i % per_row) * N;
    const Pack<T, N> g = *reinterpret_cast<const Pack<T, N>*>(in + row * 2 * f + col);
    const Pack<T, N> u = *reinterpret_cast<const Pack<T, N>*>(in + row * 2 * f + f + col);
    const Pack<T, N> dy = *reinterpret_cast<const Pack<T, N>*>(grad_out + row * f + col);
    Pack<T, N> dg, du;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float x = to_float(g.v[k]), up = to_float(u.v[k]), d = to_float(dy.v[k]);
      const float sg = sigmoid(x);
      // d silu(x) / dx = sigmoid(x) * (1 + x * (1 - sigmoid(x)))
      dg.v[k] = from_float<T>(d * up * sg * (1.0f + x * (1.0f - sg)));
      du.v[k] = from_float<T>(d * x * sg);
    }
    *reinterpret_cast<Pack<T, N>*>(grad_in + row * 2 * f + col) = dg;
    *reinterpret_cast<Pack<T, N>*>(grad_in + row * 2 * f + f + col) = du;
  }
}

}  // namespace

void swiglu_forward(const void* in, void* out, int64_t rows, int64_t f, DType dtype, Stream stream) {
  if (rows == 0 || f == 0) return;
  constexpr int threads = 256;
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    with_pack<T>(f, {in, out}, [&](auto pack) {
      constexpr int N = decltype(pack)::value;
      swiglu_forward_kernel<T, N><<<grid_for(rows * f / N, threads), threads, 0, stream>>>(
          static_cast<const T*>(in), static_cast<T*>(out), rows, f);
    });
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(const void* grad_out, const void* in, void* grad_in, int64_t rows, int64_t f, DType dtype,
                     Stream stream) {
  if (rows == 0 || f == 0) return;
  constexpr int threads = 256;
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    with_pack<T>(f, {grad_out, in, grad_in}, [&](auto pack) {
      constexpr int N = decltype(pack)::value;
      swiglu_backward_kernel<T, N><<<grid_for(rows * f / N, threads), threads, 0, stream>>>(
          static_cast<const T*>(grad_out), static_cast<const T*>(in), static_cast<T*>(grad_in), rows, f);
    });
  });
  check_launch("swiglu_backward");
}

}  // namespace megatron::kernels::cuda
