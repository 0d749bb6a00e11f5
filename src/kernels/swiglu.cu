// Fused SwiGLU: silu(gate) * up in one pass forward and both input gradients in one pass
// backward, saving only the [gate | up] input (ATen's composite runs four kernels each way and
// keeps silu(gate) as well).
#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

// One block per row; threads walk the f output channels.
template <typename T>
__global__ void swiglu_forward_kernel(const T* in, T* out, int64_t f) {
  const T* gate = in + blockIdx.x * 2 * f;
  const T* up = gate + f;
  T* o = out + blockIdx.x * f;
  for (int64_t j = threadIdx.x; j < f; j += blockDim.x) {
    const float g = to_float(gate[j]);
    o[j] = from_float<T>(g * sigmoid(g) * to_float(up[j]));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* grad_out, const T* in, T* grad_in, int64_t f) {
  const T* gate = in + blockIdx.x * 2 * f;
  const T* up = gate + f;
  const T* go = grad_out + blockIdx.x * f;
  T* grad_gate = grad_in + blockIdx.x * 2 * f;
  T* grad_up = grad_gate + f;
  for (int64_t j = threadIdx.x; j < f; j += blockDim.x) {
    const float g = to_float(gate[j]), u = to_float(up[j]), dy = to_float(go[j]);
    const float sg = sigmoid(g);
    // d silu(g) / dg = sigmoid(g) * (1 + g * (1 - sigmoid(g)))
    grad_gate[j] = from_float<T>(dy * u * sg * (1.0f + g * (1.0f - sg)));
    grad_up[j] = from_float<T>(dy * g * sg);
  }
}

int threads_for(int64_t f) { return f >= 1024 ? 1024 : static_cast<int>(((f + 31) / 32) * 32); }

}  // namespace

void swiglu_forward(const void* in, void* out, int64_t rows, int64_t f, DType dtype, Stream stream) {
  if (rows == 0 || f == 0) return;
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    swiglu_forward_kernel<T><<<static_cast<unsigned>(rows), threads_for(f), 0, stream>>>(
        static_cast<const T*>(in), static_cast<T*>(out), f);
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(const void* grad_out, const void* in, void* grad_in, int64_t rows, int64_t f, DType dtype,
                     Stream stream) {
  if (rows == 0 || f == 0) return;
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    swiglu_backward_kernel<T><<<static_cast<unsigned>(rows), threads_for(f), 0, stream>>>(
        static_cast<const T*>(grad_out), static_cast<const T*>(in), static_cast<T*>(grad_in), f);
  });
  check_launch("swiglu_backward");
}

}  // namespace megatron::kernels::cuda
