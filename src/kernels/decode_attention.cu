// Attention of a decode step (one new token per sequence) over the key/value cache where it lies,
// in one launch. FA2's kernel for this case is two launches (the split-KV pass and the combine),
// neither overlapping the kernel before it, ~10-12 us a layer on an H100 at 128-2048 keys for
// batch 1: more than the layer's keys and values take to stream.
//
// A block takes one sequence, one KV group (its P query heads share the keys: each key row is read
// once for all of them) and one split of the sequence's keys. Threads work in teams of d / 8, one
// 16-byte pack of a key or value row each: a team scores whole keys (the dot product reduced over
// the team by shuffles), then, after the tile's softmax statistics, adds whole value rows into its
// own accumulators, several rows in flight a round. The P heads' outputs are summed over teams and
// warps once at the end. Up to 512 keys on sm_90 the splits (of 64 keys) of a (sequence, group)
// run as one thread-block cluster and merge their log-sum-exps through distributed shared memory
// (merge_in_cluster); otherwise the last split to finish (a ticket counter) merges them from
// records in global memory, and resets the counter for the next launch.
//
// The grid is fixed by the cache's capacity (a CUDA graph replays it at every length); each block
// reads the sequence's real key count on the device and leaves when its split is past the keys.
// The block's key and value rows are prefetched into L2 before waiting for the kernel before
// (programmatic dependent launch): they were written by earlier steps, all but the newest row.
#include <cooperative_groups.h>

#include <cmath>

#include "kernels/cuda_common.cuh"

namespace megatron::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 256;        // keys scored before their values are added
constexpr int kMinSplitKeys = 128;  // a split takes at least this many keys (fewer splits below)
constexpr int kMaxSplits = 16;
// Splits merged in a thread-block cluster (sm_90): up to 512 keys, splits of 64 keys (one round
// of a team's rows each), at most 8 blocks a cluster (the portable size).
constexpr int kClusterSplitKeys = 64;
constexpr int kClusterMostKeys = 512;
constexpr int kClusterMostSplits = kClusterMostKeys / kClusterSplitKeys;
constexpr int kInFlight = 4;      // key or value rows a team loads before using them
constexpr float kLog2e = 1.4426950408889634f;

template <typename T>
__device__ __forceinline__ Pack<T, 8> load8(const T* p) {
  return *reinterpret_cast<const Pack<T, 8>*>(p);
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// The kernel's P for `heads_per_group` query heads a group: the next power of two, at most 8.
inline int rounded_heads(int64_t heads_per_group) {
  return heads_per_group <= 1 ? 1 : heads_per_group <= 2 ? 2 : heads_per_group <= 4 ? 4 : 8;
}

// Splits this sequence's keys take: at most `splits` (the grid's), each at least kMinSplitKeys
// (kClusterSplitKeys when the splits merge in a cluster).
template <bool kCluster>
__device__ __forceinline__ int used_splits(int count, int splits) {
  constexpr int kSplitKeys = kCluster ? kClusterSplitKeys : kMinSplitKeys;
  const int wanted = (count + kSplitKeys - 1) / kSplitKeys;
  return wanted < 1 ? 1 : (wanted < splits ? wanted : splits);
}

// The splits of one (sequence, group) as one thread-block cluster (block rank = split): each block's
// record (its [P][D] unnormalised outputs, P maxima and P sums) stays in its shared memory, and
// after the cluster's barrier every block writes a share of the outputs, reading the records it
// needs through distributed shared memory: no global record, fence or ticket between the splits.
// Every block of the cluster calls this, those past the used splits too (the barriers count them).
template <typename T, int D, int P>
__device__ __forceinline__ void merge_in_cluster(const DecodeAttentionArgs& a, float* record, float* maxima, float* sums,
                                                 float (*weights)[P], int used, T* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's record is written
  if (threadIdx.x < P) {
    const int p = threadIdx.x;
    float m = -INFINITY;
    for (int s = 0; s < used; ++s) m = fmaxf(m, *cluster.map_shared_rank(maxima + p, s));
    float total = 0.0f;
    for (int s = 0; s < used; ++s) {
      const float w = exp2f(*cluster.map_shared_rank(maxima + p, s) - m);
      weights[s][p] = w;
      total += w * *cluster.map_shared_rank(sums + p, s);
    }
    for (int s = 0; s < used; ++s) weights[s][p] /= total;
  }
  __syncthreads();
  const int rank = static_cast<int>(cluster.block_rank()), blocks = static_cast<int>(cluster.num_blocks());
  for (int i = rank * kThreads + threadIdx.x; i < a.heads_per_group * D; i += blocks * kThreads) {
    float v = 0.0f;
#pragma unroll 4
    for (int s = 0; s < used; ++s) v += weights[s][i / D] * *cluster.map_shared_rank(record + i, s);
    out[i] = from_float<T>(v);
  }
  cluster.sync();  // no block's shared memory goes while another still reads it
#else
  (void)a, (void)record, (void)maxima, (void)sums, (void)weights, (void)used, (void)out;
  __trap();  // launched in clusters only on sm_90 and later (decode_attention_merges_in_cluster)
#endif
}

// D: head dim (64 or 128); P: query heads a group, rounded up to a power of two (heads past the
// real count score zeros and are not written). kCluster: the splits of a (sequence, group) are
// one cluster and merge there (merge_in_cluster), else through global memory and a ticket.
template <typename T, int D, int P, bool kCluster>
__global__ void __launch_bounds__(kThreads) decode_attention_kernel(DecodeAttentionArgs a) {
  constexpr int kTeam = D / 8;               // lanes a row
  constexpr int kTeams = kThreads / kTeam;   // rows a block handles at once
  __shared__ float scores[P][kTile];         // the tile's scores, then its softmax weights
  __shared__ float run_max[P], run_sum[P], rescale[P];
  __shared__ float partial[kWarps][P][D];    // each warp's accumulators, summed at the end
  __shared__ float merge[kMaxSplits][P];     // the last block's weight of each split
  __shared__ bool last_block;

  const int sequence = blockIdx.z, group = blockIdx.x, split = blockIdx.y;
  const int team = threadIdx.x / kTeam, lane_in_team = threadIdx.x % kTeam;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Written before this step's first kernel (the graph's copies or the step's set-up), never by
  // the kernel before: safe to read before waiting for it.
  const int count = a.key_counts[sequence];
  const int used = used_splits<kCluster>(count, a.splits);
  const int real_heads = a.heads_per_group;
  T* out = static_cast<T*>(a.out) + (int64_t(sequence) * a.heads + int64_t(group) * real_heads) * D;
  let_next_kernel_start();
  if (split >= used || count <= 0) {
    if (count <= 0 && split == 0) {  // no keys (not a real decode step): zeros, not NaNs
      wait_for_kernel_before();
      for (int i = threadIdx.x; i < real_heads * D; i += kThreads) out[i] = from_float<T>(0.0f);
    }
    if constexpr (kCluster) {
      if (count > 0 && used > 1) {  // a split past the keys of a merging cluster: it shares the writing
        wait_for_kernel_before();
        merge_in_cluster<T, D, P>(a, &partial[0][0][0], run_max, run_sum, merge, used, out);
      }
    }
    return;
  }
  const int chunk = (count + used - 1) / used;
  const int begin = split * chunk, end = begin + chunk < count ? begin + chunk : count;
  const T* k_base = static_cast<const T*>(a.k) + (int64_t(a.key_starts[sequence]) * a.k_row_stride + int64_t(group) * D);
  const T* v_base = static_cast<const T*>(a.v) + (int64_t(a.key_starts[sequence]) * a.v_row_stride + int64_t(group) * D);
  for (int j = begin + threadIdx.x; j < end; j += kThreads) {
#pragma unroll
    for (int line = 0; line < D * int(sizeof(T)); line += 128) {
      prefetch_l2(reinterpret_cast<const char*>(k_base + int64_t(j) * a.k_row_stride) + line);
      prefetch_l2(reinterpret_cast<const char*>(v_base + int64_t(j) * a.v_row_stride) + line);
    }
  }
  wait_for_kernel_before();

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
  float acc[P][8] = {};  // this lane's 8 channels of each head's sum of weighted values
  if (threadIdx.x < P) run_max[threadIdx.x] = -INFINITY, run_sum[threadIdx.x] = 0.0f;

  for (int tile = begin; tile < end; tile += kTile) {
    const int n = end - tile < kTile ? end - tile : kTile;
    // Scores: every team runs every round (the shuffles need whole warps); rows past n score zeros.
    for (int round = 0; round < n; round += kTeams * kInFlight) {
      Pack<T, 8> rows[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int j = round + u * kTeams + team;
        if (j < n) {
          rows[u] = load8(k_base + int64_t(tile + j) * a.k_row_stride + lane_in_team * 8);
        } else {
#pragma unroll
          for (int x = 0; x < 8; ++x) rows[u].v[x] = from_float<T>(0.0f);
        }
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int j = round + u * kTeams + team;
#pragma unroll
        for (int p = 0; p < P; ++p) {
          float s = 0.0f;
#pragma unroll
          for (int x = 0; x < 8; ++x) s += q[p][x] * to_float(rows[u].v[x]);
#pragma unroll
          for (int o = kTeam / 2; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffff, s, o);
          if (lane_in_team == 0 && j < n) scores[p][j] = s;
        }
      }
    }
    __syncthreads();
    // The tile's softmax statistics, a warp a head: the new running max, the weights against it,
    // and how much the sums so far shrink.
    for (int p = warp; p < P; p += kWarps) {
      float m = -INFINITY;
      for (int j = lane; j < n; j += 32) m = fmaxf(m, scores[p][j]);
      for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
      const float new_max = fmaxf(run_max[p], m);
      float sum = 0.0f;
      for (int j = lane; j < n; j += 32) {
        const float w = exp2f(scores[p][j] - new_max);
        scores[p][j] = w;
        sum += w;
      }
      for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffff, sum, o);
      if (lane == 0) {
        const float shrink = exp2f(run_max[p] - new_max);  // 0 at the first tile (-inf)
        rescale[p] = shrink;
        run_sum[p] = run_sum[p] * shrink + sum;
        run_max[p] = new_max;
      }
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < P; ++p) {
#pragma unroll
      for (int x = 0; x < 8; ++x) acc[p][x] *= rescale[p];
    }
    for (int round = 0; round < n; round += kTeams * kInFlight) {
      Pack<T, 8> rows[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int j = round + u * kTeams + team;
        if (j < n) rows[u] = load8(v_base + int64_t(tile + j) * a.v_row_stride + lane_in_team * 8);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int j = round + u * kTeams + team;
        if (j >= n) continue;
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const float w = scores[p][j];
#pragma unroll
          for (int x = 0; x < 8; ++x) acc[p][x] += w * to_float(rows[u].v[x]);
        }
      }
    }
    __syncthreads();  // the next tile's scores overwrite these weights
  }

  // Sum the teams: within a warp by shuffles (teams are lane groups), then the warps in shared memory.
#pragma unroll
  for (int p = 0; p < P; ++p) {
#pragma unroll
    for (int x = 0; x < 8; ++x) {
#pragma unroll
      for (int o = kTeam; o < 32; o *= 2) acc[p][x] += __shfl_xor_sync(0xffffffff, acc[p][x], o);
      if (lane < kTeam) partial[warp][p][lane * 8 + x] = acc[p][x];
    }
  }
  __syncthreads();
  auto summed = [&](int i) {  // i = p * D + channel
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += (&partial[w][0][0])[i];
    return v;
  };
  if (used == 1) {
    for (int i = threadIdx.x; i < real_heads * D; i += kThreads) out[i] = from_float<T>(summed(i) / run_sum[i / D]);
    return;
  }
  if constexpr (kCluster) {
    // The warps' sums added into warp 0's rows (each thread its own elements): the block's record.
    for (int i = threadIdx.x; i < P * D; i += kThreads) (&partial[0][0][0])[i] = summed(i);
    __syncthreads();
    merge_in_cluster<T, D, P>(a, &partial[0][0][0], run_max, run_sum, merge, used, out);
    return;
  }
  // This split's record: [P][D] unnormalised outputs, then P maxima and P sums.
  const int64_t record = int64_t(P) * D + 2 * P;
  const int64_t pair = int64_t(sequence) * a.groups + group;
  float* mine = a.partials + (pair * a.splits + split) * record;
  for (int i = threadIdx.x; i < P * D; i += kThreads) mine[i] = summed(i);
  if (threadIdx.x < P) mine[P * D + threadIdx.x] = run_max[threadIdx.x], mine[P * D + P + threadIdx.x] = run_sum[threadIdx.x];
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
    for (int s = 0; s < used; ++s) v += merge[s][i / D] * __ldcg(records + s * record + i);
    out[i] = from_float<T>(v);
  }
  if (threadIdx.x == 0) a.tickets[pair] = 0;  // ready for the next launch
}

template <typename T, int D, bool kCluster>
void launch_for(const DecodeAttentionArgs& a, Stream stream) {
  const dim3 grid(static_cast<unsigned>(a.groups), static_cast<unsigned>(a.splits), static_cast<unsigned>(a.batch));
  const dim3 cluster(1, kCluster ? static_cast<unsigned>(a.splits) : 1, 1);  // a cluster: the splits of one (sequence, group)
  const char* name = "decode_attention";
  switch (rounded_heads(a.heads_per_group)) {
    case 1: launch_overlapping_in_clusters(name, a.overlap_previous, cluster, decode_attention_kernel<T, D, 1, kCluster>, grid, kThreads, 0, stream, a); break;
    case 2: launch_overlapping_in_clusters(name, a.overlap_previous, cluster, decode_attention_kernel<T, D, 2, kCluster>, grid, kThreads, 0, stream, a); break;
    case 4: launch_overlapping_in_clusters(name, a.overlap_previous, cluster, decode_attention_kernel<T, D, 4, kCluster>, grid, kThreads, 0, stream, a); break;
    default: launch_overlapping_in_clusters(name, a.overlap_previous, cluster, decode_attention_kernel<T, D, 8, kCluster>, grid, kThreads, 0, stream, a);
  }
}

template <typename T, int D>
void launch_for_dim(const DecodeAttentionArgs& a, Stream stream) {
  if (a.merge_in_cluster && a.splits > 1) launch_for<T, D, true>(a, stream);
  else launch_for<T, D, false>(a, stream);
}

template <typename T>
void launch(const DecodeAttentionArgs& a, Stream stream) {
  if (a.head_dim == 64) launch_for_dim<T, 64>(a, stream);
  else launch_for_dim<T, 128>(a, stream);
}

}  // namespace

bool decode_attention_merges_in_cluster(int64_t longest, int64_t batch, int64_t groups) {
  // Only while the grid fits one wave of blocks (H100: 132 SMs): beyond it the 8-block clusters
  // wait for room in a GPC, and the global merge wins (session 39, one H100: 16 sequences at a
  // 512-key bound 28.8 us clustered, 13.0 merged through global memory; one sequence 9.1 against 10.9).
  constexpr int64_t kOneWave = 128;
  const int64_t blocks = batch * groups * ((longest + kClusterSplitKeys - 1) / kClusterSplitKeys);
  return longest <= kClusterMostKeys && blocks <= kOneWave && overlapping_launch_supported();
}

int decode_attention_splits(int64_t longest, int64_t batch, int64_t groups) {
  const int64_t split_keys = decode_attention_merges_in_cluster(longest, batch, groups) ? kClusterSplitKeys : kMinSplitKeys;
  const int64_t by_keys = (longest + split_keys - 1) / split_keys;
  // Enough blocks to fill the GPU a few times over, no more: a large batch needs few splits.
  const int64_t by_blocks = 512 / (batch * groups > 0 ? batch * groups : 1);
  int64_t splits = by_keys < by_blocks ? by_keys : by_blocks;
  if (splits > kMaxSplits) splits = kMaxSplits;
  return static_cast<int>(splits < 1 ? 1 : splits);
}

int64_t decode_attention_partial_floats(const DecodeAttentionArgs& a) {
  const int64_t p = rounded_heads(a.heads_per_group);  // the kernel's record holds P heads
  return a.splits > 1 && !a.merge_in_cluster ? a.batch * a.groups * a.splits * (p * a.head_dim + 2 * p) : 0;
}

bool decode_attention_supported(const DecodeAttentionArgs& a) {
  return (a.dtype == DType::BFloat16 || a.dtype == DType::Float16) && (a.head_dim == 64 || a.head_dim == 128) &&
         a.heads_per_group >= 1 && a.heads_per_group <= 8 && a.heads == a.groups * a.heads_per_group && a.k_row_stride % 8 == 0 &&
         a.v_row_stride % 8 == 0 && aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && a.splits >= 1 && a.splits <= kMaxSplits &&
         (!a.merge_in_cluster || (a.splits <= kClusterMostSplits && overlapping_launch_supported()));
}

void decode_attention(const DecodeAttentionArgs& a, Stream stream) {
  if (a.batch == 0) return;
  if (!decode_attention_supported(a)) {
    throw std::runtime_error("decode_attention: bf16 / fp16, head dim 64 or 128, at most 8 query heads a KV group, 16-byte rows; "
                             "splits merged in a cluster: at most 8, on sm_90 or later");
  }
  if (a.splits > 1 && !a.merge_in_cluster && (a.partials == nullptr || a.tickets == nullptr)) {
    throw std::runtime_error("decode_attention: several splits need the partials workspace and the zeroed tickets");
  }
  if (a.dtype == DType::BFloat16) launch<__nv_bfloat16>(a, stream);
  else launch<__half>(a, stream);
}

}  // namespace megatron::kernels::cuda
