// Fused rotary embedding: one pass reading x and writing y (either may be a strided view of the
// QKV output or its gradient), instead of ATen's narrow / neg / cat / two multiplies / add.
#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

// Where head `head` of a token starts in x or y, given that tensor's group and head strides.
__device__ __forceinline__ int64_t head_offset(const RopeArgs& a, int64_t head, int64_t stride_group, int64_t stride_n) {
  return (head / a.heads_per_group) * stride_group + (head % a.heads_per_group) * stride_n;
}

// Any layout (partial rotary, unaligned strides): one block per (position, sample); its threads
// walk the n heads x d channels of that token, one element each.
template <typename T>
__global__ void rope_kernel(RopeArgs a) {
  const int64_t si = blockIdx.x / a.b, bi = blockIdx.x % a.b;
  const T* x = static_cast<const T*>(a.x) + si * a.x_stride_s + bi * a.x_stride_b;
  T* y = static_cast<T*>(a.y) + si * a.y_stride_s + bi * a.y_stride_b;
  const float* cos = a.cos + si * a.table_stride_s + bi * a.table_stride_b;
  const float* sin = a.sin + si * a.table_stride_s + bi * a.table_stride_b;
  const int d = static_cast<int>(a.d), rot = static_cast<int>(a.rot_dim), half = rot / 2;
  const int total = static_cast<int>(a.n) * d;
  for (int k = threadIdx.x; k < total; k += blockDim.x) {
    const int head = k / d, j = k % d;
    const T* xh = x + head_offset(a, head, a.x_stride_group, a.x_stride_n);
    float out = to_float(xh[j]);
    if (j < rot) {
      const bool first = j < half;
      const int partner = first ? j + half : j - half;
      const float xp = to_float(xh[partner]);
      // Forward, with x = [x1, x2]: y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin.
      // Inverse (transpose):        x1 = y1 cos + y2 sin', x2 = y2 cos - y1 sin' (sin' = partner's).
      if (!a.inverse) {
        out = out * cos[j] + (first ? -xp : xp) * sin[j];
      } else {
        out = out * cos[j] + (first ? xp : -xp) * sin[partner];
      }
    }
    y[head_offset(a, head, a.y_stride_group, a.y_stride_n) + j] = from_float<T>(out);
  }
}

// Whole-head rotation (rot_dim == d) in 16-byte packs: work item i covers N channels j..j+N of
// the first half of one head of one token and their partners j+half..j+half+N, so each value is
// loaded once. Items are flat over (token, head, pack) so small heads counts still fill blocks.
template <typename T, int N>
__global__ void rope_packed_kernel(RopeArgs a) {
  const int64_t half = a.rot_dim / 2, packs = half / N, per_token = a.n * packs, items = a.s * a.b * per_token;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token = i / per_token, head = (i % per_token) / packs, j = (i % packs) * N;
    const int64_t si = token / a.b, bi = token % a.b;
    const T* x = static_cast<const T*>(a.x) + si * a.x_stride_s + bi * a.x_stride_b +
                 head_offset(a, head, a.x_stride_group, a.x_stride_n);
    T* y = static_cast<T*>(a.y) + si * a.y_stride_s + bi * a.y_stride_b + head_offset(a, head, a.y_stride_group, a.y_stride_n);
    const float* cos = a.cos + si * a.table_stride_s + bi * a.table_stride_b;
    const float* sin = a.sin + si * a.table_stride_s + bi * a.table_stride_b;
    const Pack<T, N> x1 = *reinterpret_cast<const Pack<T, N>*>(x + j);
    const Pack<T, N> x2 = *reinterpret_cast<const Pack<T, N>*>(x + j + half);
    Pack<T, N> y1, y2;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float a1 = to_float(x1.v[k]), a2 = to_float(x2.v[k]);
      const float c1 = cos[j + k], c2 = cos[j + half + k], s1 = sin[j + k], s2 = sin[j + half + k];
      if (!a.inverse) {
        y1.v[k] = from_float<T>(a1 * c1 - a2 * s1);
        y2.v[k] = from_float<T>(a2 * c2 + a1 * s2);
      } else {
        y1.v[k] = from_float<T>(a1 * c1 + a2 * s2);
        y2.v[k] = from_float<T>(a2 * c2 - a1 * s1);
      }
    }
    *reinterpret_cast<Pack<T, N>*>(y + j) = y1;
    *reinterpret_cast<Pack<T, N>*>(y + j + half) = y2;
  }
}

// The decode step's QKV output: work item i covers N channels of the first half of one head of
// one token (and their partners), the heads of a group being its P queries, its key and its
// value. Queries rotate into q_out, the key rotates into its cache row, the value is copied there.
template <typename T, int N>
__global__ void rope_qkv_into_cache_kernel(QkvIntoCacheArgs a) {
  const int64_t half = a.d / 2, packs = half / N, heads = a.groups * (a.heads_per_group + 2), per_token = heads * packs;
  const int64_t items = a.s * a.b * per_token;
  let_next_kernel_start();  // launched to overlap the QKV projection before it
  wait_for_kernel_before();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < items; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token = i / per_token, slot = (i % per_token) / packs, j = (i % packs) * N;
    const int64_t si = token / a.b, bi = token % a.b;
    const int64_t group = slot / (a.heads_per_group + 2), head = slot % (a.heads_per_group + 2);
    const T* x = static_cast<const T*>(a.qkv) + si * a.x_stride_s + bi * a.x_stride_b + group * a.x_stride_group + head * a.d;
    const Pack<T, N> x1 = *reinterpret_cast<const Pack<T, N>*>(x + j);
    const Pack<T, N> x2 = *reinterpret_cast<const Pack<T, N>*>(x + j + half);
    const int64_t row = a.store_rows[bi * a.s + si];  // sequence-major
    T* y;
    if (head < a.heads_per_group) {
      y = static_cast<T*>(a.q_out) + ((si * a.b + bi) * a.groups * a.heads_per_group + group * a.heads_per_group + head) * a.d;
    } else {
      y = static_cast<T*>(head == a.heads_per_group ? a.k_store : a.v_store) + row * a.store_stride_row + group * a.store_stride_group;
    }
    if (head == a.heads_per_group + 1) {  // the value: copied as it is
      *reinterpret_cast<Pack<T, N>*>(y + j) = x1;
      *reinterpret_cast<Pack<T, N>*>(y + j + half) = x2;
      continue;
    }
    const float* cos = a.cos + si * a.table_stride_s + bi * a.table_stride_b;
    const float* sin = a.sin + si * a.table_stride_s + bi * a.table_stride_b;
    Pack<T, N> y1, y2;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float a1 = to_float(x1.v[k]), a2 = to_float(x2.v[k]);
      y1.v[k] = from_float<T>(a1 * cos[j + k] - a2 * sin[j + k]);
      y2.v[k] = from_float<T>(a2 * cos[j + half + k] + a1 * sin[j + half + k]);
    }
    *reinterpret_cast<Pack<T, N>*>(y + j) = y1;
    *reinterpret_cast<Pack<T, N>*>(y + j + half) = y2;
  }
}

template <typename T>
bool packable(const RopeArgs& a) {
  constexpr int N = kPack<T>;
  return a.rot_dim == a.d && (a.rot_dim / 2) % N == 0 && a.x_stride_s % N == 0 && a.x_stride_b % N == 0 &&
         a.x_stride_n % N == 0 && a.x_stride_group % N == 0 && a.y_stride_s % N == 0 && a.y_stride_b % N == 0 &&
         a.y_stride_n % N == 0 && a.y_stride_group % N == 0 && aligned16(a.x) && aligned16(a.y);
}

}  // namespace

void rope(const RopeArgs& args, Stream stream) {
  if (args.s * args.b == 0 || args.n * args.d == 0) return;
  with_storage_type(args.dtype, [&](auto type) {
    using T = decltype(type);
    if (packable<T>(args)) {
      constexpr int N = kPack<T>, threads = 256;
      const int64_t items = args.s * args.b * args.n * (args.rot_dim / 2 / N);
      rope_packed_kernel<T, N><<<grid_for(items, threads), threads, 0, stream>>>(args);
    } else {
      const int threads = static_cast<int>(args.n * args.d >= 512 ? 512 : ((args.n * args.d + 31) / 32) * 32);
      rope_kernel<T><<<static_cast<unsigned>(args.s * args.b), threads, 0, stream>>>(args);
    }
  });
  check_launch("rope");
}

bool rope_qkv_into_cache_supported(const QkvIntoCacheArgs& a) {
  bool ok = false;
  with_storage_type(a.dtype, [&](auto type) {
    using T = decltype(type);
    constexpr int N = kPack<T>;
    ok = a.dtype != DType::Float32 && (a.d / 2) % N == 0 && a.x_stride_s % N == 0 && a.x_stride_b % N == 0 && a.x_stride_group % N == 0 &&
         a.store_stride_row % N == 0 && a.store_stride_group % N == 0 && aligned16(a.qkv) && aligned16(a.q_out) &&
         aligned16(a.k_store) && aligned16(a.v_store);
  });
  return ok;
}

void rope_qkv_into_cache(const QkvIntoCacheArgs& args, Stream stream) {
  if (args.s * args.b == 0) return;
  if (!rope_qkv_into_cache_supported(args)) throw std::runtime_error("rope_qkv_into_cache: bf16 / fp16 in 16-byte packs");
  with_storage_type(args.dtype, [&](auto type) {
    using T = decltype(type);
    constexpr int N = kPack<T>, threads = 256;
    const int64_t items = args.s * args.b * args.groups * (args.heads_per_group + 2) * (args.d / 2 / N);
    launch_overlapping("rope_qkv_into_cache", true, rope_qkv_into_cache_kernel<T, N>, grid_for(items, threads), threads, 0, stream, args);
  });
}

}  // namespace megatron::kernels::cuda
