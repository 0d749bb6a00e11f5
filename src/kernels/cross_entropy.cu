// Fused cross entropy over (a tensor-parallel slice of) the vocabulary: one read of the logits
// in their storage type for the row statistics, one read + write for the gradient. ATen's path
// materialises fp32 logits, an fp32 softmax kept for backward and several passes over both.
#include <cfloat>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

constexpr int kThreads = 512;

// Running (max, sum of exp(x - max)) pairs merge without overflow.
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  if (a.max == -FLT_MAX) return b;
  if (b.max == -FLT_MAX) return a;
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * __expf(a.max - m) + b.sum * __expf(b.max - m)};
}

// Folds one logit into a running (max, sum of exp(x - max)).
__device__ __forceinline__ void accumulate(MaxSum& acc, float x) {
  if (x > acc.max) {
    acc.sum = acc.max == -FLT_MAX ? 1.0f : acc.sum * __expf(acc.max - x) + 1.0f;
    acc.max = x;
  } else {
    acc.sum += __expf(x - acc.max);
  }
}

// One block per row; N logits per 16-byte load where the rows allow (N = 1 otherwise), the
// vocab % N tail one at a time.
template <typename T, int N>
__global__ void cross_entropy_stats_kernel(const T* logits, const int64_t* targets, int64_t vocab, int64_t first,
                                           float* max, float* sum_exp, float* target_logit) {
  const T* row = logits + blockIdx.x * vocab;
  MaxSum acc{-FLT_MAX, 0.0f};
  const int64_t packs = vocab / N;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const Pack<T, N> v = reinterpret_cast<const Pack<T, N>*>(row)[p];
#pragma unroll
    for (int k = 0; k < N; ++k) accumulate(acc, to_float(v.v[k]));
  }
  for (int64_t j = packs * N + threadIdx.x; j < vocab; j += blockDim.x) accumulate(acc, to_float(row[j]));
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum other{__shfl_xor_sync(0xffffffff, acc.max, offset), __shfl_xor_sync(0xffffffff, acc.sum, offset)};
    acc = merge(acc, other);
  }
  __shared__ MaxSum warps[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warps[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum total = warps[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) total = merge(total, warps[w]);
    max[blockIdx.x] = total.max;
    sum_exp[blockIdx.x] = total.sum;
    const int64_t local = targets[blockIdx.x] - first;
    target_logit[blockIdx.x] = (local >= 0 && local < vocab) ? to_float(row[local]) : 0.0f;
  }
}

template <typename T, int N>
__global__ void cross_entropy_backward_kernel(const T* logits, const int64_t* targets, const float* max,
                                              const float* sum_exp, const float* grad_loss, T* grad_logits,
                                              int64_t vocab, int64_t first) {
  const T* row = logits + blockIdx.x * vocab;
  T* grad = grad_logits + blockIdx.x * vocab;
  const float m = max[blockIdx.x], scale = grad_loss[blockIdx.x] / sum_exp[blockIdx.x], g = grad_loss[blockIdx.x];
  const int64_t local = targets[blockIdx.x] - first;
  auto value = [&](float x, int64_t j) {
    const float p_times_g = __expf(x - m) * scale;
    return from_float<T>(j == local ? p_times_g - g : p_times_g);
  };
  const int64_t packs = vocab / N;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    const Pack<T, N> v = reinterpret_cast<const Pack<T, N>*>(row)[p];
    Pack<T, N> out;
#pragma unroll
    for (int k = 0; k < N; ++k) out.v[k] = value(to_float(v.v[k]), p * N + k);
    reinterpret_cast<Pack<T, N>*>(grad)[p] = out;
  }
  for (int64_t j = packs * N + threadIdx.x; j < vocab; j += blockDim.x) grad[j] = value(to_float(row[j]), j);
}

// Calls f with the pack width the rows allow: 16-byte packs when every row starts aligned.
template <typename T, typename F>
void with_row_pack(int64_t vocab, std::initializer_list<const void*> rows, F&& f) {
  constexpr int N = kPack<T>;
  bool packed = vocab % N == 0;
  for (const void* p : rows) packed = packed && aligned16(p);
  if (packed) {
    f(std::integral_constant<int, N>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

}  // namespace

void cross_entropy_stats(const void* logits, const int64_t* targets, int64_t rows, int64_t vocab, int64_t first,
                         DType dtype, float* max, float* sum_exp, float* target_logit, Stream stream) {
  if (rows == 0) return;
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    with_row_pack<T>(vocab, {logits}, [&](auto n) {
      cross_entropy_stats_kernel<T, decltype(n)::value><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
          static_cast<const T*>(logits), targets, vocab, first, max, sum_exp, target_logit);
    });
  });
  check_launch("cross_entropy_stats");
}

void cross_entropy_backward(const void* logits, const int64_t* targets, const float* max, const float* sum_exp,
                            const float* grad_loss, void* grad_logits, int64_t rows, int64_t vocab, int64_t first,
                            DType dtype, Stream stream) {
  if (rows == 0) return;
  with_storage_type(dtype, [&](auto type) {
    using T = decltype(type);
    with_row_pack<T>(vocab, {logits, grad_logits}, [&](auto n) {
      cross_entropy_backward_kernel<T, decltype(n)::value><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
          static_cast<const T*>(logits), targets, max, sum_exp, grad_loss, static_cast<T*>(grad_logits), vocab, first);
    });
  });
  check_launch("cross_entropy_backward");
}

}  // namespace megatron::kernels::cuda
