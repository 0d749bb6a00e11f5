// y = x W^T (+ bias) for a single row x: the linear layers of a batch-1 decode step, where every
// weight byte is read once and used once, so the layer is as fast as its weight streams from HBM.
// cuBLAS picks tiled GEMM kernels with 8-row tiles for M = 1 (and a split-K pass with its reduce
// for the narrow-output layers); here each block streams 4 weight rows in 16-byte loads, every
// thread with 4 loads in flight a step, and reduces them once (warp shuffles, then shared memory).
// Measured on an H100 with cold L2 (bench/decode_kernels_bench.cpp): 0.90-0.97x cuBLAS's time for
// most layers of the 1.1B shape and Llama 3 8B, about even over a 1.1B step, one split-K reduce
// launch a layer fewer.
#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = 4;  // weight rows a block

template <typename T>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvArgs a) {
  constexpr int N = kPack<T>;
  const int64_t first = int64_t(blockIdx.x) * kRows;
  const int rows = a.n - first < kRows ? int(a.n - first) : kRows;
  const int64_t packs = a.k / N;
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.w) + first * a.w_stride;
  float acc[kRows] = {};
#pragma unroll 2
  for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
    const Pack<T, N> xv = *reinterpret_cast<const Pack<T, N>*>(x + p * N);
    Pack<T, N> wv[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r < rows) wv[r] = *reinterpret_cast<const Pack<T, N>*>(w + r * a.w_stride + p * N);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r >= rows) continue;
#pragma unroll
      for (int j = 0; j < N; ++j) acc[r] += to_float(wv[r].v[j]) * to_float(xv.v[j]);
    }
  }
  __shared__ float warp_sums[kRows][kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float v = acc[r];
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffff, v, o);
    if (lane == 0) warp_sums[r][warp] = v;
  }
  __syncthreads();
  if (threadIdx.x < rows) {
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) v += warp_sums[threadIdx.x][i];
    const int64_t row = first + threadIdx.x;
    if (a.bias != nullptr) v += to_float(static_cast<const T*>(a.bias)[row]);
    static_cast<T*>(a.y)[row] = from_float<T>(v);
  }
}

}  // namespace

bool gemv_supported(const GemvArgs& a) {
  return (a.dtype == DType::BFloat16 || a.dtype == DType::Float16) && a.k % 8 == 0 && a.w_stride % 8 == 0 && aligned16(a.x) &&
         aligned16(a.w);
}

void gemv(const GemvArgs& args, Stream stream) {
  if (args.n == 0) return;
  if (!gemv_supported(args)) throw std::runtime_error("gemv: bf16 / fp16 rows in 16-byte packs");
  const unsigned blocks = static_cast<unsigned>((args.n + kRows - 1) / kRows);
  if (args.dtype == DType::BFloat16) gemv_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(args);
  else gemv_kernel<__half><<<blocks, kThreads, 0, stream>>>(args);
  check_launch("gemv");
}

}  // namespace megatron::kernels::cuda
