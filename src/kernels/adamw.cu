// Fused AdamW over fp32 masters that also writes the bf16 model weights: per element it reads
// gradient, master and both moments once and writes master, moments and model weight once. The
// moments are stored in fp32 or, under the precision-aware optimizer, bf16 (rounded to nearest
// once per step); the arithmetic is fp32 either way.
#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

// A moment's N values as fp32, from fp32 or bf16 storage (a choice every thread makes alike).
template <int N>
__device__ __forceinline__ Pack<float, N> load_moment(const void* p, bool bf16, int64_t i) {
  if (!bf16) return reinterpret_cast<const Pack<float, N>*>(p)[i];
  const Pack<__nv_bfloat16, N> h = reinterpret_cast<const Pack<__nv_bfloat16, N>*>(p)[i];
  Pack<float, N> out;
#pragma unroll
  for (int k = 0; k < N; ++k) out.v[k] = __bfloat162float(h.v[k]);
  return out;
}

template <int N>
__device__ __forceinline__ void store_moment(void* p, bool bf16, int64_t i, const Pack<float, N>& value) {
  if (!bf16) {
    reinterpret_cast<Pack<float, N>*>(p)[i] = value;
    return;
  }
  Pack<__nv_bfloat16, N> h;
#pragma unroll
  for (int k = 0; k < N; ++k) h.v[k] = __float2bfloat16(value.v[k]);
  reinterpret_cast<Pack<__nv_bfloat16, N>*>(p)[i] = h;
}

// The fp32 master weight from its bf16 model weight (the high half, rounded) and the int16
// remainder, and back: the high half rounded half away from zero, the remainder what it leaves
// (in [-2^15, 2^15)), so the pair holds the fp32 value exactly.
__device__ __forceinline__ float join_master(uint16_t high, int16_t remainder) {
  return __uint_as_float((uint32_t(high) << 16) + uint32_t(int32_t(remainder)));
}
__device__ __forceinline__ void split_master(float master, uint16_t& high, int16_t& remainder) {
  const uint32_t bits = __float_as_uint(master), top = (bits + 0x8000u) >> 16;
  high = uint16_t(top);
  remainder = int16_t(int32_t(bits - (top << 16)));
}

// 4 fp32 elements per thread (16-byte loads) where the pointers allow; Model is the storage type
// of the model copy (void: none), Grad the gradients' (fp32, or bf16 reduced in bf16).
// Remainder: the master is the bf16 model weight plus an int16 remainder (Model is bf16).
template <typename Model, typename Grad, int N, bool Remainder = false>
__global__ void adamw_kernel(AdamWArgs a) {
  if (*a.found_inf != 0.0f) return;  // a skipped iteration (non-finite loss or gradient norm)
  const float scale = *a.grad_scale;
  const float bias_correction1 = a.bias_corrections[0], bias_correction2_sqrt = a.bias_corrections[1];
  const float lr = static_cast<float>(*a.lr);
  const float beta1 = a.beta1, beta2 = a.beta2;
  const float step_size = lr / bias_correction1;
  const int64_t items = a.n / N;
  const bool m_bf16 = a.exp_avg_dtype == DType::BFloat16, v_bf16 = a.exp_avg_sq_dtype == DType::BFloat16;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items; i += int64_t(gridDim.x) * blockDim.x) {
    Pack<float, N> p;
    if constexpr (Remainder) {
      const Pack<uint16_t, N> high = reinterpret_cast<const Pack<uint16_t, N>*>(a.model)[i];
      const Pack<int16_t, N> low = reinterpret_cast<const Pack<int16_t, N>*>(a.master)[i];
#pragma unroll
      for (int k = 0; k < N; ++k) p.v[k] = join_master(high.v[k], low.v[k]);
    } else {
      p = reinterpret_cast<const Pack<float, N>*>(a.master)[i];
    }
    Pack<float, N> m = load_moment<N>(a.exp_avg, m_bf16, i);
    Pack<float, N> v = load_moment<N>(a.exp_avg_sq, v_bf16, i);
    const Pack<Grad, N> g = reinterpret_cast<const Pack<Grad, N>*>(a.grad)[i];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      // The order of operations of ATen's fused AdamW, so the two agree to rounding.
      const float grad = to_float(g.v[k]) / scale;
      p.v[k] -= lr * a.weight_decay * p.v[k];
      m.v[k] = beta1 * m.v[k] + (1.0f - beta1) * grad;
      v.v[k] = beta2 * v.v[k] + (1.0f - beta2) * grad * grad;
      const float denom = sqrtf(v.v[k]) / bias_correction2_sqrt + a.eps;
      p.v[k] -= step_size * m.v[k] / denom;
    }
    store_moment<N>(a.exp_avg, m_bf16, i, m);
    store_moment<N>(a.exp_avg_sq, v_bf16, i, v);
    if constexpr (Remainder) {
      Pack<uint16_t, N> high;
      Pack<int16_t, N> low;
#pragma unroll
      for (int k = 0; k < N; ++k) split_master(p.v[k], high.v[k], low.v[k]);
      reinterpret_cast<Pack<uint16_t, N>*>(a.model)[i] = high;
      reinterpret_cast<Pack<int16_t, N>*>(a.master)[i] = low;
      continue;
    }
    reinterpret_cast<Pack<float, N>*>(a.master)[i] = p;
    if constexpr (!std::is_void_v<Model>) {
      Pack<Model, N> out;
#pragma unroll
      for (int k = 0; k < N; ++k) out.v[k] = from_float<Model>(p.v[k]);
      reinterpret_cast<Pack<Model, N>*>(a.model)[i] = out;
    }
  }
}

template <typename Model, typename Grad, bool Remainder = false>
void launch(const AdamWArgs& a, Stream stream) {
  // Packs of 4 need 16-byte aligned fp32 arrays and 8-byte aligned 16-bit model weights and
  // gradients (slices of the flat buffers at odd offsets take the one-element kernel).
  auto aligned = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  auto moment_aligned = [&](const void* p, DType t) { return aligned(p, t == DType::BFloat16 ? 8 : 16); };
  bool packed = a.n % 4 == 0 && aligned(a.master, Remainder ? 8 : 16) && moment_aligned(a.exp_avg, a.exp_avg_dtype) &&
                moment_aligned(a.exp_avg_sq, a.exp_avg_sq_dtype) && aligned(a.grad, 4 * sizeof(Grad)) &&
                (a.model == nullptr || aligned(a.model, 8));
  constexpr int threads = 256;
  if (packed) {
    adamw_kernel<Model, Grad, 4, Remainder><<<grid_for(a.n / 4, threads), threads, 0, stream>>>(a);
  } else {
    adamw_kernel<Model, Grad, 1, Remainder><<<grid_for(a.n, threads), threads, 0, stream>>>(a);
  }
}

template <typename Model, bool Remainder = false>
void launch_for_grad(const AdamWArgs& a, Stream stream) {
  if (a.grad_dtype == DType::BFloat16) {
    launch<Model, __nv_bfloat16, Remainder>(a, stream);
  } else {
    launch<Model, float, Remainder>(a, stream);
  }
}

}  // namespace

void adamw_step(const AdamWArgs& args, Stream stream) {
  if (args.n == 0) return;
  if (args.master_remainder) {
    launch_for_grad<__nv_bfloat16, true>(args, stream);
  } else if (args.model == nullptr) {
    launch_for_grad<void>(args, stream);
  } else {
    with_storage_type(args.model_dtype, [&](auto type) { launch_for_grad<decltype(type)>(args, stream); });
  }
  check_launch("adamw_step");
}

}  // namespace megatron::kernels::cuda
