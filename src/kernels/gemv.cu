// y = x W^T (+ bias) for a single row x: the linear layers of a batch-1 decode step, where every
// weight byte is read once and used once, so the layer is as fast as its weight streams from HBM.
// cuBLAS picks tiled GEMM kernels with 8-row tiles for M = 1 (and a split-K pass with its reduce
// for the narrow-output layers); here each block streams 4 weight rows in 16-byte loads, every
// thread with 4 loads in flight a step, and reduces them once (warp shuffles, then shared memory).
// Measured on an H100 with cold L2 (bench/decode_kernels_bench.cpp): 0.90-0.97x cuBLAS's time for
// most layers of the 1.1B shape and Llama 3 8B, about even over a 1.1B step, one split-K reduce
// launch a layer fewer.
//
// The weights are parameters, written by no kernel of the step: each thread issues its first
// kAhead steps of weight loads (all of them for k <= 2048) before waiting for the kernel before
// (programmatic dependent launch, cuda_common.cuh), so under a CUDA graph the weights stream while
// the last kernel finishes. With `gated` (SwiGLU's fc1, rows [gate; up]) a block takes gate rows
// r.. and up rows f + r.. and writes silu(gate) * up: the MLP's activation without a launch.
#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = 4;   // output rows a block
constexpr int kAhead = 2;  // steps of weight loads issued before waiting for the kernel before

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}

// kGated: kRows gate rows and the kRows up rows f = n further on; else kRows rows.
template <typename T, bool kGated>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvArgs a) {
  constexpr int N = kPack<T>;
  constexpr int kLoads = kGated ? 2 * kRows : kRows;  // weight rows this block reads
  const int64_t first = int64_t(blockIdx.x) * kRows;
  const int rows = a.n - first < kRows ? int(a.n - first) : kRows;
  const int64_t packs = a.k / N;
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.w);
  const T* row[kLoads];
#pragma unroll
  for (int r = 0; r < kLoads; ++r) {
    const int i = r % kRows;
    row[r] = w + ((r < kRows ? 0 : a.n) + first + (i < rows ? i : 0)) * a.w_stride;  // past the end: re-read row 0
  }
  Pack<T, N> ahead[kAhead][kLoads];
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    const int64_t p = threadIdx.x + int64_t(s) * kThreads;
    if (p < packs) {
#pragma unroll
      for (int r = 0; r < kLoads; ++r) ahead[s][r] = load_pack<T, N>(row[r] + p * N);
    }
  }
  let_next_kernel_start();
  wait_for_kernel_before();
  float acc[kLoads] = {};
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    const int64_t p = threadIdx.x + int64_t(s) * kThreads;
    if (p < packs) {
      const Pack<T, N> xv = load_pack<T, N>(x + p * N);
#pragma unroll
      for (int r = 0; r < kLoads; ++r) {
#pragma unroll
        for (int j = 0; j < N; ++j) acc[r] += to_float(ahead[s][r].v[j]) * to_float(xv.v[j]);
      }
    }
  }
#pragma unroll 2
  for (int64_t p = threadIdx.x + int64_t(kAhead) * kThreads; p < packs; p += kThreads) {
    const Pack<T, N> xv = load_pack<T, N>(x + p * N);
    Pack<T, N> wv[kLoads];
#pragma unroll
    for (int r = 0; r < kLoads; ++r) wv[r] = load_pack<T, N>(row[r] + p * N);
#pragma unroll
    for (int r = 0; r < kLoads; ++r) {
#pragma unroll
      for (int j = 0; j < N; ++j) acc[r] += to_float(wv[r].v[j]) * to_float(xv.v[j]);
    }
  }
  __shared__ float warp_sums[kLoads][kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kLoads; ++r) {
    float v = acc[r];
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffff, v, o);
    if (lane == 0) warp_sums[r][warp] = v;
  }
  __syncthreads();
  if (threadIdx.x >= rows) return;
  auto total = [&](int r) {
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) v += warp_sums[r][i];
    return v;
  };
  const int64_t out = first + threadIdx.x;
  if constexpr (kGated) {
    // Rounded as the unfused fc1 output would be, then the SwiGLU kernel's arithmetic.
    const float gate = to_float(from_float<T>(total(threadIdx.x))), up = to_float(from_float<T>(total(threadIdx.x + kRows)));
    static_cast<T*>(a.y)[out] = from_float<T>(gate / (1.0f + __expf(-gate)) * up);
  } else {
    float v = total(threadIdx.x);
    if (a.bias != nullptr) v += to_float(static_cast<const T*>(a.bias)[out]);
    static_cast<T*>(a.y)[out] = from_float<T>(v);
  }
}

template <typename T>
void launch(const GemvArgs& args, Stream stream) {
  const unsigned blocks = static_cast<unsigned>((args.n + kRows - 1) / kRows);
  if (args.gated) launch_overlapping("gemv", args.overlap_previous, gemv_kernel<T, true>, blocks, kThreads, 0, stream, args);
  else launch_overlapping("gemv", args.overlap_previous, gemv_kernel<T, false>, blocks, kThreads, 0, stream, args);
}

}  // namespace

bool gemv_supported(const GemvArgs& a) {
  return (a.dtype == DType::BFloat16 || a.dtype == DType::Float16) && a.k % 8 == 0 && a.w_stride % 8 == 0 && aligned16(a.x) &&
         aligned16(a.w) && !(a.gated && a.bias != nullptr);
}

void gemv(const GemvArgs& args, Stream stream) {
  if (args.n == 0) return;
  if (!gemv_supported(args)) throw std::runtime_error("gemv: bf16 / fp16 rows in 16-byte packs (and no bias when gated)");
  if (args.dtype == DType::BFloat16) launch<__nv_bfloat16>(args, stream);
  else launch<__half>(args, stream);
}

}  // namespace megatron::kernels::cuda
