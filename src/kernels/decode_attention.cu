// Attention of a decode step (one new token per sequence) over the key/value cache where it lies,
// in one launch. FA2's kernel for this case is two launches (the split-KV pass and the combine),
// neither overlapping the kernel before it, ~6-12 us a layer on an H100 at 128-2048 keys for
// batch 1: more than the layer's keys and values take to stream. At batch 1 the step is latency,
// not bandwidth: a 1.1B layer's 512 keys are 0.5 MB.
//
// A block takes one sequence, one KV group (its P query heads share the keys: each key row is read
// once for all of them) and one split of the sequence's keys, as short as 32 keys, so that a
// batch-1 step spreads over dozens of SMs. Threads work in teams of d / 8, one 16-byte pack of a key
// or value row each; a team takes kRowsATeam key rows and their value rows a round, all loaded
// at once, and keeps its own softmax statistics and weighted sums in registers (an online softmax
// over its rows: no shared scores, no barrier a round). The teams' sums are rescaled to the
// block's maximum and added once at the end. The last split of a (sequence, group) to finish (a
// ticket counter) merges the splits' log-sum-exps and writes the output, and resets the counter
// for the next launch.
//
// The grid is fixed by a bound on the keys (a CUDA graph replays it at every length up to it);
// each block reads the sequence's real key count on the device and leaves when its split is past
// the keys. Every key and value row but the newest was written by an earlier step, so a block
// loads its first round of rows before waiting for the kernel before (programmatic dependent
// launch), whose QKV projection writes the newest row: under a graph the rows stream while that
// kernel still runs. Later rounds (splits longer than a round) are prefetched into L2 there too.
#include <cmath>

#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsATeam = 4;     // key rows (and their value rows) a team holds a round
constexpr int kMinSplitKeys = 32;  // a split takes at least this many keys (fewer splits below)
constexpr int kMaxSplits = 16;
constexpr float kLog2e = 1.4426950408889634f;

template <typename T>
__device__ __forceinline__ Pack<T, 8> load8(const T* p) {
  return *reinterpret_cast<const Pack<T, 8>*>(p);
}

template <typename T>
__device__ __forceinline__ Pack<T, 8> zeros8() {
  Pack<T, 8> z;
#pragma unroll
  for (int x = 0; x < 8; ++x) z.v[x] = from_float<T>(0.0f);
  return z;
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// The kernel's P for `heads_per_group` query heads a group: the next power of two, at most 8.
inline int rounded_heads(int64_t heads_per_group) {
  return heads_per_group <= 1 ? 1 : heads_per_group <= 2 ? 2 : heads_per_group <= 4 ? 4 : 8;
}

// Splits this sequence's keys take: at most `splits` (the grid's), each at least kMinSplitKeys.
__device__ __forceinline__ int used_splits(int count, int splits) {
  const int wanted = (count + kMinSplitKeys - 1) / kMinSplitKeys;
  return wanted < 1 ? 1 : (wanted < splits ? wanted : splits);
}

// D: head dim (64 or 128); P: query heads a group, rounded up to a power of two (heads past the
// real count score zeros and are not written).
template <typename T, int D, int P>
__global__ void __launch_bounds__(kThreads) decode_attention_kernel(DecodeAttentionArgs a) {
  constexpr int kTeam = D / 8;              // lanes a row
  constexpr int kTeams = kThreads / kTeam;  // rows a block handles at once
  constexpr int kRound = kTeams * kRowsATeam;  // keys a round
  __shared__ float warp_max[kWarps][P];
  __shared__ float warp_sum[kWarps][P];
  __shared__ float partial[kWarps][P][D];  // each warp's weighted sums, added at the end
  __shared__ float merge[kMaxSplits][P];   // the last block's weight of each split
  __shared__ bool last_block;

  const int sequence = blockIdx.z, group = blockIdx.x, split = blockIdx.y;
  const int team = threadIdx.x / kTeam, lane_in_team = threadIdx.x % kTeam;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Written before this step's first kernel (the graph's copies or the step's set-up), never by
  // the kernel before: safe to read before waiting for it.
  const int count = a.key_counts[sequence];
  const int used = used_splits(count, a.splits);
  let_next_kernel_start();
  if (split >= used || count <= 0) {
    if (count <= 0 && split == 0) {  // no keys (not a real decode step): zeros, not NaNs
      wait_for_kernel_before();
      T* out = static_cast<T*>(a.out);
      for (int i = threadIdx.x; i < a.heads_per_group * D; i += kThreads) {
        out[(int64_t(sequence) * a.heads + int64_t(group) * a.heads_per_group) * D + i] = from_float<T>(0.0f);
      }
    }
    return;
  }
  const int chunk = (count + used - 1) / used;
  const int begin = split * chunk, end = begin + chunk < count ? begin + chunk : count;
  const int newest = count - 1;  // this step's key and value, written by the kernel before
  const T* k_base = static_cast<const T*>(a.k) + (int64_t(a.key_starts[sequence]) * a.k_row_stride + int64_t(group) * D);
  const T* v_base = static_cast<const T*>(a.v) + (int64_t(a.key_starts[sequence]) * a.v_row_stride + int64_t(group) * D);
  auto k_row = [&](int j) { return k_base + int64_t(j) * a.k_row_stride + lane_in_team * 8; };
  auto v_row = [&](int j) { return v_base + int64_t(j) * a.v_row_stride + lane_in_team * 8; };

  // The first round's rows of this team (row begin + u kTeams + team), all but the newest.
  Pack<T, 8> k_rows[kRowsATeam], v_rows[kRowsATeam];
#pragma unroll
  for (int u = 0; u < kRowsATeam; ++u) {
    const int j = begin + u * kTeams + team;
    k_rows[u] = j < end && j != newest ? load8(k_row(j)) : zeros8<T>();
    v_rows[u] = j < end && j != newest ? load8(v_row(j)) : zeros8<T>();
  }
  for (int j = begin + kRound + threadIdx.x; j < end; j += kThreads) {  // later rounds: into L2
#pragma unroll
    for (int line = 0; line < D * int(sizeof(T)); line += 128) {
      prefetch_l2(reinterpret_cast<const char*>(k_base + int64_t(j) * a.k_row_stride) + line);
      prefetch_l2(reinterpret_cast<const char*>(v_base + int64_t(j) * a.v_row_stride) + line);
    }
  }
  wait_for_kernel_before();
#pragma unroll
  for (int u = 0; u < kRowsATeam; ++u) {
    if (begin + u * kTeams + team == newest) k_rows[u] = load8(k_row(newest)), v_rows[u] = load8(v_row(newest));
  }

  // This lane's 8 channels of each head's query, scaled so that exp2 of a score is exp of the logit.
  float q[P][8];
  const T* q_base = static_cast<const T*>(a.q) + (int64_t(sequence) * a.heads + int64_t(group) * a.heads_per_group) * D;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    if (p < a.heads_per_group) {
      const Pack<T, 8> v = load8(q_base + p * D + lane_in_team * 8);
#pragma unroll
      for (int x = 0; x < 8; ++x) q[p][x] = to_float(v.v[x]) * a.scale * kLog2e;
    } else {
#pragma unroll
      for (int x = 0; x < 8; ++x) q[p][x] = 0.0f;
    }
  }
  // The team's softmax statistics over its rows so far (every lane of a team holds the same) and
  // this lane's 8 channels of each head's weighted sum of values against run_max.
  float run_max[P], run_sum[P], acc[P][8] = {};
#pragma unroll
  for (int p = 0; p < P; ++p) run_max[p] = -INFINITY, run_sum[p] = 0.0f;

  for (int first = begin; first < end; first += kRound) {
    if (first != begin) {  // a later round (a split longer than kRound keys): rows from L2
#pragma unroll
      for (int u = 0; u < kRowsATeam; ++u) {
        const int j = first + u * kTeams + team;
        k_rows[u] = j < end ? load8(k_row(j)) : zeros8<T>();
        v_rows[u] = j < end ? load8(v_row(j)) : zeros8<T>();
      }
    }
    // Scores: every team runs every row slot the block has (the shuffles need whole warps); slots
    // past the split's end score -inf.
    float s[kRowsATeam][P];
#pragma unroll
    for (int u = 0; u < kRowsATeam; ++u) {
      const bool real = first + u * kTeams + team < end;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        float dot = 0.0f;
#pragma unroll
        for (int x = 0; x < 8; ++x) dot += q[p][x] * to_float(k_rows[u].v[x]);
#pragma unroll
        for (int o = kTeam / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffff, dot, o);
        s[u][p] = real ? dot : -INFINITY;
      }
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
      float m = run_max[p];
#pragma unroll
      for (int u = 0; u < kRowsATeam; ++u) m = fmaxf(m, s[u][p]);
      if (m == -INFINITY) continue;  // no rows for this team yet
      const float shrink = exp2f(run_max[p] - m);  // 0 at the team's first rows (-inf)
      run_sum[p] *= shrink;
#pragma unroll
      for (int x = 0; x < 8; ++x) acc[p][x] *= shrink;
#pragma unroll
      for (int u = 0; u < kRowsATeam; ++u) {
        const float w = exp2f(s[u][p] - m);  // 0 for slots past the end
        run_sum[p] += w;
#pragma unroll
        for (int x = 0; x < 8; ++x) acc[p][x] += w * to_float(v_rows[u].v[x]);
      }
      run_max[p] = m;
    }
  }

  // The block's maximum of each head, then every team's sums rescaled to it and added: within a
  // warp by shuffles (teams are lane groups), then the warps in shared memory.
#pragma unroll
  for (int p = 0; p < P; ++p) {
    float m = run_max[p];
#pragma unroll
    for (int o = kTeam; o < 32; o *= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    if (lane == 0) warp_max[warp][p] = m;
  }
  __syncthreads();
  float block_max[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    block_max[p] = warp_max[0][p];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) block_max[p] = fmaxf(block_max[p], warp_max[w][p]);
    // The split has keys, so the block's maximum is finite; a team without rows weighs 0.
    const float f = run_max[p] == -INFINITY ? 0.0f : exp2f(run_max[p] - block_max[p]);
    float sum = run_sum[p] * f;
#pragma unroll
    for (int o = kTeam; o < 32; o *= 2) sum += __shfl_xor_sync(0xffffffff, sum, o);
    if (lane == 0) warp_sum[warp][p] = sum;
#pragma unroll
    for (int x = 0; x < 8; ++x) {
      float v = acc[p][x] * f;
#pragma unroll
      for (int o = kTeam; o < 32; o *= 2) v += __shfl_xor_sync(0xffffffff, v, o);
      if (lane < kTeam) partial[warp][p][lane * 8 + x] = v;
    }
  }
  __syncthreads();
  const int real_heads = a.heads_per_group;
  T* out = static_cast<T*>(a.out) + (int64_t(sequence) * a.heads + int64_t(group) * real_heads) * D;
  auto summed = [&](int i) {  // i = p * D + channel
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += (&partial[w][0][0])[i];
    return v;
  };
  auto block_max_of = [&](int p) {  // block_max[p], for a head known only at run time
    float v = warp_max[0][p];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = fmaxf(v, warp_max[w][p]);
    return v;
  };
  auto block_sum = [&](int p) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += warp_sum[w][p];
    return v;
  };
  if (used == 1) {
    for (int i = threadIdx.x; i < real_heads * D; i += kThreads) out[i] = from_float<T>(summed(i) / block_sum(i / D));
    return;
  }
  // This split's record: [P][D] unnormalised outputs, then P maxima and P sums.
  const int64_t record = int64_t(P) * D + 2 * P;
  const int64_t pair = int64_t(sequence) * a.groups + group;
  float* mine = a.partials + (pair * a.splits + split) * record;
  for (int i = threadIdx.x; i < P * D; i += kThreads) mine[i] = summed(i);
  if (threadIdx.x < P) mine[P * D + threadIdx.x] = block_max_of(threadIdx.x), mine[P * D + P + threadIdx.x] = block_sum(threadIdx.x);
  __threadfence();  // the record is visible before the ticket says so
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(&a.tickets[pair], 1) == used - 1;
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  const float* records = a.partials + pair * a.splits * record;
  if (threadIdx.x < P) {
    const int p = threadIdx.x;
    float m = -INFINITY;
    for (int s = 0; s < used; ++s) m = fmaxf(m, __ldcg(records + s * record + P * D + p));
    float total = 0.0f;
    for (int s = 0; s < used; ++s) {
      const float w = exp2f(__ldcg(records + s * record + P * D + p) - m);
      merge[s][p] = w;
      total += w * __ldcg(records + s * record + P * D + P + p);
    }
    for (int s = 0; s < used; ++s) merge[s][p] /= total;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < real_heads * D; i += kThreads) {
    float v = 0.0f;
#pragma unroll 4
    for (int s = 0; s < used; ++s) v += merge[s][i / D] * __ldcg(records + s * record + i);
    out[i] = from_float<T>(v);
  }
  if (threadIdx.x == 0) a.tickets[pair] = 0;  // ready for the next launch
}

template <typename T, int D>
void launch_for_dim(const DecodeAttentionArgs& a, Stream stream) {
  const dim3 grid(static_cast<unsigned>(a.groups), static_cast<unsigned>(a.splits), static_cast<unsigned>(a.batch));
  switch (rounded_heads(a.heads_per_group)) {
    case 1: launch_overlapping("decode_attention", a.overlap_previous, decode_attention_kernel<T, D, 1>, grid, kThreads, 0, stream, a); break;
    case 2: launch_overlapping("decode_attention", a.overlap_previous, decode_attention_kernel<T, D, 2>, grid, kThreads, 0, stream, a); break;
    case 4: launch_overlapping("decode_attention", a.overlap_previous, decode_attention_kernel<T, D, 4>, grid, kThreads, 0, stream, a); break;
    default: launch_overlapping("decode_attention", a.overlap_previous, decode_attention_kernel<T, D, 8>, grid, kThreads, 0, stream, a);
  }
}

template <typename T>
void launch(const DecodeAttentionArgs& a, Stream stream) {
  if (a.head_dim == 64) launch_for_dim<T, 64>(a, stream);
  else launch_for_dim<T, 128>(a, stream);
}

}  // namespace

int decode_attention_splits(int64_t longest, int64_t batch, int64_t groups) {
  const int64_t by_keys = (longest + kMinSplitKeys - 1) / kMinSplitKeys;
  // Enough blocks to fill the GPU a few times over, no more: a large batch needs few splits.
  const int64_t by_blocks = 512 / (batch * groups > 0 ? batch * groups : 1);
  int64_t splits = by_keys < by_blocks ? by_keys : by_blocks;
  if (splits > kMaxSplits) splits = kMaxSplits;
  return static_cast<int>(splits < 1 ? 1 : splits);
}

int64_t decode_attention_partial_floats(const DecodeAttentionArgs& a) {
  const int64_t p = rounded_heads(a.heads_per_group);  // the kernel's record holds P heads
  return a.splits > 1 ? a.batch * a.groups * a.splits * (p * a.head_dim + 2 * p) : 0;
}

bool decode_attention_supported(const DecodeAttentionArgs& a) {
  return (a.dtype == DType::BFloat16 || a.dtype == DType::Float16) && (a.head_dim == 64 || a.head_dim == 128) &&
         a.heads_per_group >= 1 && a.heads_per_group <= 8 && a.heads == a.groups * a.heads_per_group && a.k_row_stride % 8 == 0 &&
         a.v_row_stride % 8 == 0 && aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && a.splits >= 1 && a.splits <= kMaxSplits;
}

void decode_attention(const DecodeAttentionArgs& a, Stream stream) {
  if (a.batch == 0) return;
  if (!decode_attention_supported(a)) {
    throw std::runtime_error("decode_attention: bf16 / fp16, head dim 64 or 128, at most 8 query heads a KV group, 16-byte rows");
  }
  if (a.splits > 1 && (a.partials == nullptr || a.tickets == nullptr)) {
    throw std::runtime_error("decode_attention: several splits need the partials workspace and the zeroed tickets");
  }
  if (a.dtype == DType::BFloat16) launch<__nv_bfloat16>(a, stream);
  else launch<__half>(a, stream);
}

}  // namespace megatron::kernels::cuda
