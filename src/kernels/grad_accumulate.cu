// A gradient added into (or written over) its fp32 accumulator, upcast as it is read: the
// gradient buffer's main_grad += grad for gradients a GEMM did not accumulate itself (the MoE
// grouped GEMM's, hooks'). One vectorised pass; ATen's mixed-dtype copy and add take the
// element-at-a-time casting path, at well under the memory bandwidth.
#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

template <typename T, int N, bool Overwrite>
__global__ void accumulate_kernel(float* dst, const T* src, int64_t n) {
  const int64_t items = n / N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items; i += int64_t(gridDim.x) * blockDim.x) {
    const Pack<T, N> g = reinterpret_cast<const Pack<T, N>*>(src)[i];
    Pack<float, N> out;
    if constexpr (!Overwrite) out = reinterpret_cast<const Pack<float, N>*>(dst)[i];
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = Overwrite ? to_float(g.v[k]) : out.v[k] + to_float(g.v[k]);
    reinterpret_cast<Pack<float, N>*>(dst)[i] = out;
  }
  // The tail past the last whole pack, one element each.
  for (int64_t i = items * N + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = Overwrite ? to_float(src[i]) : dst[i] + to_float(src[i]);
  }
}

template <typename T, bool Overwrite>
void launch(float* dst, const T* src, int64_t n, Stream stream) {
  constexpr int threads = 256;
  // 8 or 4 elements a thread where both arrays are aligned to a whole pack of them (a pack of
  // N values is aligned to its size), else one (parameters at odd offsets in the flat buffer).
  auto aligned = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  if (aligned(dst, 8 * sizeof(float)) && aligned(src, 8 * sizeof(T))) {
    accumulate_kernel<T, 8, Overwrite><<<grid_for(n / 8 + 1, threads), threads, 0, stream>>>(dst, src, n);
  } else if (aligned(dst, 4 * sizeof(float)) && aligned(src, 4 * sizeof(T))) {
    accumulate_kernel<T, 4, Overwrite><<<grid_for(n / 4 + 1, threads), threads, 0, stream>>>(dst, src, n);
  } else {
    accumulate_kernel<T, 1, Overwrite><<<grid_for(n, threads), threads, 0, stream>>>(dst, src, n);
  }
}

}  // namespace

void accumulate_into_fp32(float* dst, const void* src, int64_t n, DType src_dtype, bool overwrite, Stream stream) {
  if (n == 0) return;
  with_storage_type(src_dtype, [&](auto type) {
    using T = decltype(type);
    if (overwrite) {
      launch<T, true>(dst, static_cast<const T*>(src), n, stream);
    } else {
      launch<T, false>(dst, static_cast<const T*>(src), n, stream);
    }
  });
  check_launch("accumulate_into_fp32");
}

}  // namespace megatron::kernels::cuda
