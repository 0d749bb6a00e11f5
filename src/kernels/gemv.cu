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
// With a pending RMSNorm (norm_weight) the dot products take the residual sum x + add times the
// norm's weight and the block sums the row's squares alongside, scaling its results by 1 / rms at
// the end (input_pack), so the norm in front of QKV and fc1 is no launch of its own either; block
// 0 also writes the sum, the residual stream's next value. Better still, the GEMV before the norm
// (the attention's output projection, fc2) adds the residual in its epilogue, writes the sum times
// the next norm's weight and its block's sum of squares (Epilogue::ResidualNorm), and the GEMV
// after it reads that scaled row as a plain input plus the n / 4 partial sums (Input::Prepared):
// the norm then costs neither a launch nor a byte of the row more than a plain input.
// With RoPE into the cache (a decode step's QKV) a block takes the two rotation pairs of one head
// and writes them rotated where rope_qkv_into_cache would: the RoPE kernel's launch saved too.
#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = static_cast<int>(kGemvRows);  // output rows a block
constexpr int kAhead = 2;  // steps of weight loads issued before waiting for the kernel before

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}

// The input's pack p as the dot products take it, in fp32: x; or with a pending norm the sum
// s = x + add rounded to T (block 0 stores it: the residual stream's next value) times the norm's
// weight, its squares added to `squares`. The norm's 1 / rms is one number for the row, so it
// scales the finished dot products instead (y = rstd W (s g)): the block's threads read every
// pack of the row between them anyway, and their squares sum to the row's. No pass over the row
// before the dot products (the pass that made the norm in the prologue slower than its own kernel,
// session 33), and the normed input is not rounded to T on its way (the norm kernel rounds it).
// Input::Prepared: x is already sum * g (Epilogue::ResidualNorm wrote it) and the squares come
// from that epilogue's partial sums instead.
enum class Input { Plain, Norm, Prepared };

template <typename T, Input I>
__device__ __forceinline__ void input_pack(const GemvArgs& a, int64_t p, float (&v)[kPack<T>], float& squares) {
  constexpr int N = kPack<T>;
  Pack<T, N> x = load_pack<T, N>(static_cast<const T*>(a.x) + p * N);
  if constexpr (I == Input::Norm) {
    if (a.add != nullptr) {
      const Pack<T, N> d = load_pack<T, N>(static_cast<const T*>(a.add) + p * N);
#pragma unroll
      for (int j = 0; j < N; ++j) x.v[j] = from_float<T>(to_float(x.v[j]) + to_float(d.v[j]));
      if (blockIdx.x == 0 && a.sum_out != nullptr) reinterpret_cast<Pack<T, N>*>(a.sum_out)[p] = x;
    }
    const Pack<T, N> g = load_pack<T, N>(static_cast<const T*>(a.norm_weight) + p * N);
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const float s = to_float(x.v[j]);
      squares += s * s;
      v[j] = s * to_float(g.v[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = to_float(x.v[j]);
  }
}

// What a block writes: kRows rows of y; SwiGLU of kRows gate rows and the kRows up rows n further
// on; the rows of a rotation pair, rotated into the query output or the cache (GemvRopeIntoCache);
// or kRows rows of the residual sum, of it times the next norm's weight, and their squares' sum.
enum class Epilogue { Plain, Gated, RopeIntoCache, ResidualNorm };

// The output row of a block's i-th row: consecutive rows, or for RoPE rows j, j + 1, j + d/2,
// j + d/2 + 1 of one head (two rotation pairs, i and i ^ 2).
template <Epilogue E>
__device__ __forceinline__ int64_t output_row(const GemvArgs& a, int i) {
  if constexpr (E == Epilogue::RopeIntoCache) {
    const int64_t d = a.rope.head_dim, blocks_a_head = d / 4;
    const int64_t head = blockIdx.x / blocks_a_head, j = (blockIdx.x % blocks_a_head) * 2;
    return head * d + j + (i & 1) + (i >> 1) * (d / 2);
  } else {
    return int64_t(blockIdx.x) * kRows + i;
  }
}

// I: how the input is read (plain, a pending norm's sum, or prepared by an epilogue above).
template <typename T, Epilogue E, Input I>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvArgs a) {
  constexpr int N = kPack<T>;
  constexpr bool kGated = E == Epilogue::Gated;
  constexpr int kLoads = kGated ? 2 * kRows : kRows;  // weight rows this block reads
  const int64_t first = int64_t(blockIdx.x) * kRows;
  const int rows = a.n - first < kRows ? int(a.n - first) : kRows;
  const int64_t packs = a.k / N;
  const T* w = static_cast<const T*>(a.w);
  const T* row[kLoads];
#pragma unroll
  for (int r = 0; r < kLoads; ++r) {
    const int i = r % kRows;
    row[r] = w + ((r < kRows ? 0 : a.n) + output_row<E>(a, i < rows ? i : 0)) * a.w_stride;  // past the end: re-read row 0
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
  float squares = 0.0f;  // with a pending norm: this thread's packs' share of the sum's squares
  if constexpr (I == Input::Prepared) {
    // This thread's share of the producing blocks' sums (a fixed order: the same total every run).
    for (int64_t i = threadIdx.x; i < a.norm_square_count; i += kThreads) squares += a.norm_squares[i];
  }
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    const int64_t p = threadIdx.x + int64_t(s) * kThreads;
    if (p < packs) {
      float xv[N];
      input_pack<T, I>(a, p, xv, squares);
#pragma unroll
      for (int r = 0; r < kLoads; ++r) {
#pragma unroll
        for (int j = 0; j < N; ++j) acc[r] += to_float(ahead[s][r].v[j]) * xv[j];
      }
    }
  }
#pragma unroll 2
  for (int64_t p = threadIdx.x + int64_t(kAhead) * kThreads; p < packs; p += kThreads) {
    Pack<T, N> wv[kLoads];
#pragma unroll
    for (int r = 0; r < kLoads; ++r) wv[r] = load_pack<T, N>(row[r] + p * N);
    float xv[N];
    input_pack<T, I>(a, p, xv, squares);
#pragma unroll
    for (int r = 0; r < kLoads; ++r) {
#pragma unroll
      for (int j = 0; j < N; ++j) acc[r] += to_float(wv[r].v[j]) * xv[j];
    }
  }
  constexpr bool kNormed = I != Input::Plain;
  constexpr int kSums = kNormed ? kLoads + 1 : kLoads;  // with a norm, the squares last
  __shared__ float warp_sums[kSums][kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kSums; ++r) {
    float v = r < kLoads ? acc[r] : squares;
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffff, v, o);
    if (lane == 0) warp_sums[r][warp] = v;
  }
  __syncthreads();
  if (threadIdx.x >= rows) return;
  auto sum_of = [&](int r) {
    float v = 0.0f;
#pragma unroll
    for (int i = 0; i < kThreads / 32; ++i) v += warp_sums[r][i];
    return v;
  };
  // Row r's dot product, times the norm's 1 / rms where one is pending.
  const float rstd = kNormed ? rsqrtf(sum_of(kSums - 1) / static_cast<float>(a.k) + a.norm_eps) : 1.0f;
  auto total = [&](int r) { return sum_of(r) * rstd; };
  const int64_t out = output_row<E>(a, threadIdx.x);
  if constexpr (E == Epilogue::RopeIntoCache) {
    // The output rounded as the QKV layer's would be, then rope_qkv_into_cache's arithmetic; the
    // partner of a rotation pair is thread i ^ 2 (threads 0-3, one warp).
    float v = total(threadIdx.x);
    if (a.bias != nullptr) v += to_float(static_cast<const T*>(a.bias)[out]);
    const float own = to_float(from_float<T>(v));
    const float partner = __shfl_xor_sync(0xf, own, 2);
    const GemvRopeIntoCache& r = a.rope;
    const int64_t d = r.head_dim, head = out / d, channel = out % d;
    const int64_t group = head / (r.heads_per_group + 2), slot = head % (r.heads_per_group + 2);
    float value = own;  // the value: copied as it is
    if (slot <= r.heads_per_group) {  // a query or the key: x1 cos - x2 sin, x2 cos + x1 sin
      value = threadIdx.x < 2 ? own * r.cos[channel] - partner * r.sin[channel] : own * r.cos[channel] + partner * r.sin[channel];
    }
    T* destination = slot < r.heads_per_group
                         ? static_cast<T*>(r.q_out) + (group * r.heads_per_group + slot) * d
                         : static_cast<T*>(slot == r.heads_per_group ? r.k_store : r.v_store) + r.store_row[0] * r.store_stride_row +
                               group * r.store_stride_group;
    destination[channel] = from_float<T>(value);
  } else if constexpr (E == Epilogue::ResidualNorm) {
    // add_rms_norm's sum (the layer's output rounded, then the add rounded), the next GEMV's
    // input (the sum times the norm's weight, rounded), and the rows' squares summed over the
    // block's four threads (n is a multiple of kRows: all four are here).
    const float delta = to_float(from_float<T>(total(threadIdx.x)));
    const T sum = from_float<T>(to_float(static_cast<const T*>(a.residual)[out]) + delta);
    static_cast<T*>(a.y)[out] = sum;
    const float s = to_float(sum);
    static_cast<T*>(a.scaled_out)[out] = from_float<T>(s * to_float(static_cast<const T*>(a.next_norm_weight)[out]));
    float square = s * s;
#pragma unroll
    for (int o = 1; o < kRows; o *= 2) square += __shfl_xor_sync((1u << kRows) - 1, square, o);
    if (threadIdx.x == 0) a.squares_out[blockIdx.x] = square;
  } else if constexpr (kGated) {
    // Rounded as the unfused fc1 output would be, then the SwiGLU kernel's arithmetic.
    const float gate = to_float(from_float<T>(total(threadIdx.x))), up = to_float(from_float<T>(total(threadIdx.x + kRows)));
    static_cast<T*>(a.y)[out] = from_float<T>(gate / (1.0f + __expf(-gate)) * up);
  } else {
    float v = total(threadIdx.x);
    if (a.bias != nullptr) v += to_float(static_cast<const T*>(a.bias)[out]);
    static_cast<T*>(a.y)[out] = from_float<T>(v);
  }
}

template <typename T, Input I>
void launch(const GemvArgs& args, Stream stream) {
  const unsigned blocks = static_cast<unsigned>((args.n + kRows - 1) / kRows);
  if (args.rope.q_out != nullptr) {
    launch_overlapping("gemv", args.overlap_previous, gemv_kernel<T, Epilogue::RopeIntoCache, I>, blocks, kThreads, 0, stream, args);
  } else if (args.gated) {
    launch_overlapping("gemv", args.overlap_previous, gemv_kernel<T, Epilogue::Gated, I>, blocks, kThreads, 0, stream, args);
  } else if (args.residual != nullptr) {
    launch_overlapping("gemv", args.overlap_previous, gemv_kernel<T, Epilogue::ResidualNorm, I>, blocks, kThreads, 0, stream, args);
  } else {
    launch_overlapping("gemv", args.overlap_previous, gemv_kernel<T, Epilogue::Plain, I>, blocks, kThreads, 0, stream, args);
  }
}

template <typename T>
void launch(const GemvArgs& args, Stream stream) {
  if (args.norm_weight != nullptr) launch<T, Input::Norm>(args, stream);
  else if (args.norm_squares != nullptr) launch<T, Input::Prepared>(args, stream);
  else launch<T, Input::Plain>(args, stream);
}

}  // namespace

bool gemv_supported(const GemvArgs& a) {
  const bool norm_ok = a.norm_weight == nullptr || (aligned16(a.norm_weight) &&
                                                    (a.add == nullptr || aligned16(a.add)) && (a.sum_out == nullptr || aligned16(a.sum_out)));
  const GemvRopeIntoCache& r = a.rope;
  const bool rope_ok = r.q_out == nullptr || (!a.gated && r.head_dim > 0 && r.head_dim % 4 == 0 && r.heads_per_group > 0 &&
                                              a.n == a.n / (r.head_dim * (r.heads_per_group + 2)) * r.head_dim * (r.heads_per_group + 2) &&
                                              r.k_store != nullptr && r.v_store != nullptr && r.store_row != nullptr && r.cos != nullptr &&
                                              r.sin != nullptr);
  const bool prepared_ok = a.norm_squares == nullptr || (a.norm_weight == nullptr && a.norm_square_count > 0);
  const bool residual_ok = a.residual == nullptr || (!a.gated && a.bias == nullptr && r.q_out == nullptr && a.n % kRows == 0 &&
                                                     a.next_norm_weight != nullptr && a.scaled_out != nullptr && a.squares_out != nullptr);
  return (a.dtype == DType::BFloat16 || a.dtype == DType::Float16) && a.k % 8 == 0 && a.w_stride % 8 == 0 && aligned16(a.x) &&
         aligned16(a.w) && !(a.gated && a.bias != nullptr) && norm_ok && rope_ok && prepared_ok && residual_ok;
}

void gemv(const GemvArgs& args, Stream stream) {
  if (args.n == 0) return;
  if (!gemv_supported(args)) {
    throw std::runtime_error("gemv: bf16 / fp16 rows in 16-byte packs (no bias when gated; a pending norm's vectors 16-byte aligned; "
                             "the residual epilogue: not gated, no bias or RoPE, n a multiple of 4, all its outputs given)");
  }
  if (args.dtype == DType::BFloat16) launch<__nv_bfloat16>(args, stream);
  else launch<__half>(args, stream);
}

}  // namespace megatron::kernels::cuda
