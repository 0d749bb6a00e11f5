// Attention of one new query per sequence over its whole key/value cache (a decode step), in one
// launch. FA2 runs a decode step as its split-KV kernel and a combine kernel, ~10 us a layer for
// 512 keys at batch 1 on an H100 (docs/performance.md, session 31), most of it two launches' start
// and drain; session 31's one-launch kernels without a split lost at 2k-8k keys (one block per
// key/value head leaves the GPU idle). Here the keys are split over blocks as FA2 does, and the
// last block of a head to finish (a ticket counter) combines the splits' partial results, so the
// combine costs no launch.
//
// Block (sequence i, head chunk y, split x): heads y * C .. (C of one key/value group g, C the
// largest of 8, 4, 2, 1 that divides the group's P query heads), keys of split x. A key row of D
// elements is read by L = D / 8 lanes in 16-byte packs (D = 64: 8 lanes, 4 keys a warp at a time);
// each L-lane team keeps its own online-softmax state for its keys, the teams merge through shared
// memory, and the block writes (max, sum, unnormalised output) of its split to `partials`.
//
// Launched to overlap the kernel before (the QKV-into-cache kernel writing the newest row): the
// rows of earlier steps, written long before, are prefetched into L2 before the wait; the query
// and the newest row are read after it.
#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMinChunk = 32;  // keys a split takes at least

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

template <typename T, int D, int C>
__global__ void __launch_bounds__(kThreads) decode_attention_kernel(DecodeAttentionArgs a) {
  constexpr int N = kPack<T>;          // elements a 16-byte pack
  constexpr int L = D / N;             // lanes a key row
  constexpr int kTeams = kThreads / L; // L-lane teams in the block
  const int64_t i = blockIdx.z;
  const int chunks = int(a.heads / a.groups) / C;  // head chunks of a group
  const int g = blockIdx.y / chunks, first_head = g * int(a.heads / a.groups) + (blockIdx.y % chunks) * C;
  const int n = a.key_counts[i];
  const int64_t start = a.key_starts[i];
  const int splits = gridDim.x;
  int chunk = (n + splits - 1) / splits;
  chunk = chunk < kMinChunk ? kMinChunk : (chunk + 15) / 16 * 16;
  const int active = (n + chunk - 1) / chunk;
  const int first = int(blockIdx.x) * chunk;
  if (first >= n) {
    let_next_kernel_start();
    return;
  }
  const int last = first + chunk < n ? first + chunk : n;
  const T* k = static_cast<const T*>(a.k) + g * D;
  const T* v = static_cast<const T*>(a.v) + g * D;
  // Rows before the newest were written by earlier steps: into L2 while the kernel before runs.
  for (int key = first + int(threadIdx.x); key < last && key < n - 1; key += kThreads) {
    prefetch_l2(k + (start + key) * a.row_stride);
    prefetch_l2(v + (start + key) * a.row_stride);
    if constexpr (D * sizeof(T) > 128) {
      prefetch_l2(k + (start + key) * a.row_stride + 128 / sizeof(T));
      prefetch_l2(v + (start + key) * a.row_stride + 128 / sizeof(T));
    }
  }
  let_next_kernel_start();
  wait_for_kernel_before();

  const int team = threadIdx.x / L, part = threadIdx.x % L;  // part: this lane's pack of a row
  constexpr float kLog2e = 1.4426950408889634f;
  float q[C][N];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const Pack<T, N> qp = *reinterpret_cast<const Pack<T, N>*>(static_cast<const T*>(a.q) + (i * a.heads + first_head + c) * D + part * N);
#pragma unroll
    for (int j = 0; j < N; ++j) q[c][j] = to_float(qp.v[j]) * a.scale * kLog2e;  // scores in log2 units
  }
  float m[C], l[C], acc[C][N];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    m[c] = -INFINITY, l[c] = 0.0f;
#pragma unroll
    for (int j = 0; j < N; ++j) acc[c][j] = 0.0f;
  }
  for (int key = first + team; key < last; key += kTeams) {
    const Pack<T, N> kp = *reinterpret_cast<const Pack<T, N>*>(k + (start + key) * a.row_stride + part * N);
    const Pack<T, N> vp = *reinterpret_cast<const Pack<T, N>*>(v + (start + key) * a.row_stride + part * N);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < N; ++j) s += q[c][j] * to_float(kp.v[j]);
#pragma unroll
      for (int o = L / 2; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffff, s, o);
      const float m_new = fmaxf(m[c], s);
      const float keep = exp2f(m[c] - m_new), p = exp2f(s - m_new);
      l[c] = l[c] * keep + p;
#pragma unroll
      for (int j = 0; j < N; ++j) acc[c][j] = acc[c][j] * keep + p * to_float(vp.v[j]);
      m[c] = m_new;
    }
  }

  // The teams' states merged: team maxima and sums, then each thread sums its (head, element)s.
  __shared__ float team_max[kTeams][C], team_sum[kTeams][C];
  __shared__ float team_out[kTeams][C][D];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    if (part == 0) team_max[team][c] = m[c], team_sum[team][c] = l[c];
#pragma unroll
    for (int j = 0; j < N; ++j) team_out[team][c][part * N + j] = acc[c][j];
  }
  __syncthreads();
  float* mine = a.partials + ((i * gridDim.y + blockIdx.y) * splits + blockIdx.x) * C * (D + 2);  // [C, D + 2]
  for (int e = threadIdx.x; e < C * D; e += kThreads) {
    const int c = e / D, x = e % D;
    float big = -INFINITY;
    for (int t = 0; t < kTeams; ++t) big = fmaxf(big, team_max[t][c]);
    float sum = 0.0f, out = 0.0f;
    for (int t = 0; t < kTeams; ++t) {
      const float w = team_max[t][c] == -INFINITY ? 0.0f : exp2f(team_max[t][c] - big);  // a team without keys: 0
      sum += team_sum[t][c] * w;
      out += team_out[t][c][x] * w;
    }
    mine[c * (D + 2) + x] = out;
    if (x == 0) mine[c * (D + 2) + D] = big, mine[c * (D + 2) + D + 1] = sum;
  }

  // The last split of this (sequence, head chunk) to finish combines them all.
  __shared__ bool combines;
  __threadfence();
  __syncthreads();
  int* ticket = a.tickets + i * gridDim.y + blockIdx.y;
  if (threadIdx.x == 0) combines = atomicAdd(ticket, 1) == active - 1;
  __syncthreads();
  if (!combines) return;
  __threadfence();
  const float* all = a.partials + (i * gridDim.y + blockIdx.y) * splits * C * (D + 2);  // [splits, C, D + 2]
  for (int e = threadIdx.x; e < C * D; e += kThreads) {
    const int c = e / D, x = e % D;
    float big = -INFINITY;
    for (int s = 0; s < active; ++s) big = fmaxf(big, __ldcg(all + (s * C + c) * (D + 2) + D));
    float sum = 0.0f, out = 0.0f;
    for (int s = 0; s < active; ++s) {
      const float* p = all + (s * C + c) * (D + 2);
      const float w = exp2f(__ldcg(p + D) - big);
      sum += __ldcg(p + D + 1) * w;
      out += __ldcg(p + x) * w;
    }
    static_cast<T*>(a.out)[(i * a.heads + first_head + c) * D + x] = from_float<T>(out / sum);
  }
  if (threadIdx.x == 0) *ticket = 0;  // ready for the next call
}

// The head chunk: the largest of 8, 4, 2, 1 dividing P.
int head_chunk(int64_t per_group) { return per_group % 8 == 0 ? 8 : per_group % 4 == 0 ? 4 : per_group % 2 == 0 ? 2 : 1; }

template <typename T, int D>
void launch_for_head_dim(const DecodeAttentionArgs& a, dim3 grid, Stream stream) {
  switch (head_chunk(a.heads / a.groups)) {
    case 8: launch_overlapping(a.overlap_previous, decode_attention_kernel<T, D, 8>, grid, kThreads, 0, stream, a); break;
    case 4: launch_overlapping(a.overlap_previous, decode_attention_kernel<T, D, 4>, grid, kThreads, 0, stream, a); break;
    case 2: launch_overlapping(a.overlap_previous, decode_attention_kernel<T, D, 2>, grid, kThreads, 0, stream, a); break;
    default: launch_overlapping(a.overlap_previous, decode_attention_kernel<T, D, 1>, grid, kThreads, 0, stream, a); break;
  }
}

}  // namespace

bool decode_attention_supported(const DecodeAttentionArgs& a) {
  return (a.dtype == DType::BFloat16 || a.dtype == DType::Float16) && (a.d == 64 || a.d == 128) && a.groups >= 1 &&
         a.heads % a.groups == 0 && a.row_stride % 8 == 0 && aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.out);
}

int64_t decode_attention_head_chunks(const DecodeAttentionArgs& a) { return a.heads / head_chunk(a.heads / a.groups); }

int decode_attention_splits(const DecodeAttentionArgs& a) {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  // About two blocks an SM, no more splits than 32-key chunks of the longest sequence.
  const int64_t blocks = a.b * decode_attention_head_chunks(a);
  int64_t splits = (2 * int64_t(sms > 0 ? sms : 132) + blocks - 1) / blocks;
  const int64_t most = (a.longest + kMinChunk - 1) / kMinChunk;
  splits = splits < most ? splits : most;
  return static_cast<int>(splits < 1 ? 1 : splits > 64 ? 64 : splits);
}

int64_t decode_attention_partials(const DecodeAttentionArgs& a) {
  return a.b * decode_attention_head_chunks(a) * a.splits * head_chunk(a.heads / a.groups) * (a.d + 2);
}

void decode_attention(const DecodeAttentionArgs& a, Stream stream) {
  if (a.b == 0) return;
  if (!decode_attention_supported(a) || a.splits < 1) throw std::runtime_error("decode_attention: bf16 / fp16, head dim 64 or 128, 16-byte rows");
  const dim3 grid(static_cast<unsigned>(a.splits), static_cast<unsigned>(decode_attention_head_chunks(a)), static_cast<unsigned>(a.b));
  if (a.dtype == DType::BFloat16) {
    a.d == 64 ? launch_for_head_dim<__nv_bfloat16, 64>(a, grid, stream) : launch_for_head_dim<__nv_bfloat16, 128>(a, grid, stream);
  } else {
    a.d == 64 ? launch_for_head_dim<__half, 64>(a, grid, stream) : launch_for_head_dim<__half, 128>(a, grid, stream);
  }
}

}  // namespace megatron::kernels::cuda
