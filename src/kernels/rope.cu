// Fused rotary embedding: one pass reading x (a strided view of the QKV output is fine) and
// writing the rotated tensor, instead of ATen's narrow / neg / cat / two multiplies / add.
#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

// One block per (position, sample); its threads walk the n heads x d channels of that token.
template <typename T>
__global__ void rope_kernel(RopeArgs a) {
  const int64_t si = blockIdx.x / a.b, bi = blockIdx.x % a.b;
  const T* x = static_cast<const T*>(a.x) + si * a.x_stride_s + bi * a.x_stride_b;
  T* y = static_cast<T*>(a.y) + (si * a.b + bi) * a.n * a.d;
  const float* cos = a.cos + si * a.table_stride_s + bi * a.table_stride_b;
  const float* sin = a.sin + si * a.table_stride_s + bi * a.table_stride_b;
  const int d = static_cast<int>(a.d), rot = static_cast<int>(a.rot_dim), half = rot / 2;
  const int total = static_cast<int>(a.n) * d;
  for (int k = threadIdx.x; k < total; k += blockDim.x) {
    const int head = k / d, j = k % d;
    const T* xh = x + head * a.x_stride_n;
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
    y[k] = from_float<T>(out);
  }
}

}  // namespace

void rope(const RopeArgs& args, Stream stream) {
  if (args.s * args.b == 0 || args.n * args.d == 0) return;
  const int threads = static_cast<int>(args.n * args.d >= 512 ? 512 : ((args.n * args.d + 31) / 32) * 32);
  with_storage_type(args.dtype, [&](auto type) {
    rope_kernel<decltype(type)><<<static_cast<unsigned>(args.s * args.b), threads, 0, stream>>>(args);
  });
  check_launch("rope");
}

}  // namespace megatron::kernels::cuda
