// Shared by the .cu files: fp32 <-> storage conversions, the storage-type switch and the launch
// check. CUDA headers only (no LibTorch).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/kernels.h"

namespace megatron::kernels::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }

// N values loaded or stored as one 16-byte (or smaller) transaction.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Elements per 16-byte pack of T.
template <typename T>
constexpr int kPack = 16 / sizeof(T);

inline bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
inline bool aligned16(const void* p) { return aligned_to(p, 16); }

// Calls launch(pack width): packs of 16 bytes when every row of `f` elements starts on a pack
// boundary (f a multiple of the pack, the pointers 16-byte aligned), else one element at a time.
template <typename T, typename Launch>
void with_pack(int64_t f, std::initializer_list<const void*> pointers, Launch&& launch) {
  bool packed = f % kPack<T> == 0;
  for (const void* p : pointers) packed = packed && aligned16(p);
  if (packed) {
    launch(std::integral_constant<int, kPack<T>>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
}

// Blocks for `items` work items of one thread each: enough to cover them, capped where the
// kernels' grid-stride loops take over.
inline unsigned grid_for(int64_t items, int threads) {
  const int64_t wanted = (items + threads - 1) / threads;
  return static_cast<unsigned>(wanted < 65536 * 8 ? wanted : 65536 * 8);
}

// Sum of `v` over the block, returned to every thread. blockDim.x must be a multiple of 32
// (at most 1024); `scratch` holds 32 floats in shared memory. Safe to call repeatedly (the first
// barrier keeps a new call from overwriting what the last one's readers still read).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

// Calls f with a value of the storage type `dtype` names (its type selects the kernel).
template <typename F>
void with_storage_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::Float32: f(float{}); break;
    case DType::BFloat16: f(__nv_bfloat16{}); break;
    case DType::Float16: f(__half{}); break;
  }
}

// Programmatic dependent launch (sm_90 and later): a kernel launched with launch_overlapping()
// may start while the kernel before it on the stream still runs, once every block of that one has
// called let_next_kernel_start() (or ended). Such a kernel does what needs nothing of the kernel
// before (a GEMV's first weight loads), then wait_for_kernel_before(), which returns when that
// kernel has ended and its writes are visible. A decode step is ~200 launches of a few
// microseconds each: the overlap hides each launch's start-up behind the last one's tail. Both
// are no-ops on older devices and in kernels launched the ordinary way.
__device__ __forceinline__ void wait_for_kernel_before() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void let_next_kernel_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Thrown where the kernel named `kernel` failed to launch.
inline void throw_launch_error(const char* kernel, cudaError_t error) {
  throw std::runtime_error(std::string("CUDA kernel ") + kernel + " failed to launch: " + cudaGetErrorString(error));
}

inline void check_launch(const char* kernel) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) throw_launch_error(kernel, error);
}

// Whether the current device takes programmatic dependent launches (compute capability 9.0+;
// cuda_common.cu).
bool overlapping_launch_supported();

// kernel<<<grid, block, shared_bytes, stream>>>(args...) in thread-block clusters of `cluster`
// blocks (sm_90; 1 x 1 x 1: no clusters), allowed to overlap the kernel before it (above) where
// `overlap` and the device allow; `name` for the error when it fails to launch. The kernel must
// call wait_for_kernel_before() before it reads anything an earlier kernel wrote or writes
// anything one may still read.
template <typename... Params, typename... Args>
void launch_overlapping_in_clusters(const char* name, bool overlap, dim3 cluster, void (*kernel)(Params...), dim3 grid, dim3 block,
                                    size_t shared_bytes, Stream stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  unsigned count = 0;
  if (overlap && overlapping_launch_supported()) {
    attribute[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attribute[count].id = cudaLaunchAttributeClusterDimension;
    attribute[count].val.clusterDim.x = cluster.x;
    attribute[count].val.clusterDim.y = cluster.y;
    attribute[count++].val.clusterDim.z = cluster.z;
  }
  config.attrs = attribute;
  config.numAttrs = count;
  const cudaError_t error = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(std::forward<Args>(args))...);
  if (error != cudaSuccess) throw_launch_error(name, error);
}

// The same without clusters.
template <typename... Params, typename... Args>
void launch_overlapping(const char* name, bool overlap, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                        Stream stream, Args&&... args) {
  launch_overlapping_in_clusters(name, overlap, dim3(1, 1, 1), kernel, grid, block, shared_bytes, stream, std::forward<Args>(args)...);
}


}  // namespace megatron::kernels::cuda
