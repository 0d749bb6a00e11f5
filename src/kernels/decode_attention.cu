// Attention of one new token per sequence over its cached keys and values, read where they lie
// (generation's decode step; src/model/core_attention.cpp). One launch: each block a chunk of one
// sequence's keys for one key/value head and all the query heads that share it; the block that
// finishes a (sequence, head)'s last chunk combines the chunks' partial softmaxes.
//
// A key is read by D/8 neighbouring lanes, 16 bytes each (a row's loads coalesce), and each lane
// keeps its 8 channels of every query head in registers; a warp so covers 32/(D/8) keys at once.
// Every key and value load of the chunk is issued before any arithmetic (a decode step is
// latency-bound: at batch 1 a layer reads a few hundred KB). The first version, a lane a whole key
// with the queries in shared memory, lost to FlashAttention-2's split-KV pair on an H100
// (docs/performance.md, session 31).
#include "kernels/cuda_common.cuh"

#include <cmath>

namespace megatron::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kVec = 8;        // channels a lane: one 16-byte load of bf16 / fp16
constexpr int kKeysALane = 4;  // keys each lane group reads a chunk

template <int D>
struct ChunkShape {
  static constexpr int kLanesAKey = D / kVec;                            // 8 (D 64) or 16 (D 128)
  static constexpr int kGroups = kWarps * (32 / kLanesAKey);             // lane groups a block
  static constexpr int kChunk = kGroups * kKeysALane;                    // 64 (D 64) or 32 (D 128) keys
};

// P query heads share a key/value head; D channels a head. Grid: (chunks, G, b).
template <typename T, int D, int P>
__global__ void __launch_bounds__(kWarps * 32) decode_attention_kernel(DecodeAttentionArgs a) {
  using Shape = ChunkShape<D>;
  constexpr int L = Shape::kLanesAKey, kGroups = Shape::kGroups, kChunk = Shape::kChunk;
  const int chunk = blockIdx.x, group = blockIdx.y, seq = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int length = a.key_counts[seq];
  const int chunks = length > 0 ? (length + kChunk - 1) / kChunk : 1;
  if (chunk >= chunks) return;  // past the sequence's keys: no part in the combine
  const int64_t first_row = a.key_starts[seq];
  const int lane_group = warp * (32 / L) + lane / L, c0 = (lane % L) * kVec;  // keys lane_group + t * kGroups; channels c0..+8

  // Every load of the chunk in flight at once: this lane's slice of its keys and values.
  Pack<T, kVec> keys[kKeysALane], values[kKeysALane];
#pragma unroll
  for (int t = 0; t < kKeysALane; ++t) {
    const int key = chunk * kChunk + t * kGroups + lane_group;
    if (key < length) {
      const int64_t offset = (first_row + key) * a.kv_stride_row + group * a.kv_stride_h + c0;
      keys[t] = *reinterpret_cast<const Pack<T, kVec>*>(static_cast<const T*>(a.k) + offset);
      values[t] = *reinterpret_cast<const Pack<T, kVec>*>(static_cast<const T*>(a.v) + offset);
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) keys[t].v[j] = values[t].v[j] = from_float<T>(0.0f);
    }
  }
  float q[P][kVec];  // scaled
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const Pack<T, kVec> qp =
        *reinterpret_cast<const Pack<T, kVec>*>(static_cast<const T*>(a.q) + seq * a.q_stride_b + (group * P + p) * a.q_stride_h + c0);
#pragma unroll
    for (int j = 0; j < kVec; ++j) q[p][j] = a.scale * to_float(qp.v[j]);
  }

  // Scores [P, kChunk] in shared memory: a lane group's partial dot products summed over its lanes.
  __shared__ float weights[P][kChunk];
  __shared__ float chunk_max[P], chunk_sum[P];
  __shared__ float warp_out[kWarps][P][D];
  __shared__ bool last_block;
#pragma unroll
  for (int t = 0; t < kKeysALane; ++t) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < kVec; ++j) dot += q[p][j] * to_float(keys[t].v[j]);
#pragma unroll
      for (int o = L / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffff, dot, o);
      if (lane % L == 0) weights[p][t * kGroups + lane_group] = dot;
    }
  }
  __syncthreads();
  // Softmax statistics per query head (a warp per head); the scores become exp(score - max).
  const int chunk_keys = min(kChunk, length - chunk * kChunk);
  for (int p = warp; p < P; p += kWarps) {
    float m = -INFINITY;
    for (int k = lane; k < chunk_keys; k += 32) m = fmaxf(m, weights[p][k]);
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    float sum = 0.0f;
    for (int k = lane; k < kChunk; k += 32) {
      const float w = k < chunk_keys ? __expf(weights[p][k] - m) : 0.0f;
      weights[p][k] = w;
      sum += w;
    }
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffff, sum, o);
    if (lane == 0) chunk_max[p] = chunk_keys > 0 ? m : -INFINITY, chunk_sum[p] = sum;
  }
  __syncthreads();
  // Weighted values: each lane its 8 channels over its keys, then summed over the warp's lane
  // groups (shuffles) and the block's warps (shared memory).
  float out[P][kVec];
#pragma unroll
  for (int p = 0; p < P; ++p) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[p][j] = 0.0f;
  }
#pragma unroll
  for (int t = 0; t < kKeysALane; ++t) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const float w = weights[p][t * kGroups + lane_group];
#pragma unroll
      for (int j = 0; j < kVec; ++j) out[p][j] += w * to_float(values[t].v[j]);
    }
  }
#pragma unroll
  for (int p = 0; p < P; ++p) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
#pragma unroll
      for (int o = L; o < 32; o *= 2) out[p][j] += __shfl_xor_sync(0xffffffff, out[p][j], o);
    }
  }
  if (lane < L) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) warp_out[warp][p][c0 + j] = out[p][j];
    }
  }
  __syncthreads();

  // The chunk's partial: max, sum and unnormalised output, into the workspace [b, G, chunks, P(, D)].
  const int64_t partial = (int64_t(seq) * a.groups + group) * a.max_chunks + chunk;
  for (int i = threadIdx.x; i < P * D; i += blockDim.x) {
    const int p = i / D, c = i % D;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += warp_out[w][p][c];
    a.partial_out[(partial * P + p) * D + c] = o;
    if (c == 0) a.partial_max[partial * P + p] = chunk_max[p], a.partial_sum[partial * P + p] = chunk_sum[p];
  }
  // The last chunk of (sequence, head) to finish combines them all (threadFenceReduction's pattern);
  // it also resets the counter for the next layer and step.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = a.counters + seq * a.groups + group;
    last_block = atomicAdd(counter, 1) == chunks - 1;
    if (last_block) *counter = 0;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  const int64_t first_partial = (int64_t(seq) * a.groups + group) * a.max_chunks;
  for (int i = threadIdx.x; i < P * D; i += blockDim.x) {
    const int p = i / D, c = i % D;
    float m = -INFINITY;
    for (int k = 0; k < chunks; ++k) m = fmaxf(m, __ldcg(a.partial_max + (first_partial + k) * P + p));
    float s = 0.0f, o = 0.0f;
    if (m != -INFINITY) {
      for (int k = 0; k < chunks; ++k) {
        const float f = __expf(__ldcg(a.partial_max + (first_partial + k) * P + p) - m);
        s += __ldcg(a.partial_sum + (first_partial + k) * P + p) * f;
        o += __ldcg(a.partial_out + ((first_partial + k) * P + p) * D + c) * f;
      }
    }
    static_cast<T*>(a.out)[seq * a.out_stride_b + (group * P + p) * a.out_stride_h + c] = from_float<T>(s > 0.0f ? o / s : 0.0f);
  }
}

template <typename T, int D>
bool launch_for_heads(const DecodeAttentionArgs& a, Stream stream) {
  const dim3 grid(static_cast<unsigned>(a.max_chunks), static_cast<unsigned>(a.groups), static_cast<unsigned>(a.b));
  switch (a.heads_per_group) {
    case 1: decode_attention_kernel<T, D, 1><<<grid, kWarps * 32, 0, stream>>>(a); return true;
    case 2: decode_attention_kernel<T, D, 2><<<grid, kWarps * 32, 0, stream>>>(a); return true;
    case 4: decode_attention_kernel<T, D, 4><<<grid, kWarps * 32, 0, stream>>>(a); return true;
    case 8: decode_attention_kernel<T, D, 8><<<grid, kWarps * 32, 0, stream>>>(a); return true;
    default: return false;
  }
}

}  // namespace

int64_t decode_attention_chunk(int64_t head_dim) { return head_dim == 64 ? ChunkShape<64>::kChunk : ChunkShape<128>::kChunk; }

bool decode_attention_supported(int64_t head_dim, int64_t heads_per_group, DType dtype) {
  return dtype != DType::Float32 && (head_dim == 64 || head_dim == 128) &&
         (heads_per_group == 1 || heads_per_group == 2 || heads_per_group == 4 || heads_per_group == 8);
}

void decode_attention(const DecodeAttentionArgs& args, Stream stream) {
  if (args.b == 0) return;
  if (!decode_attention_supported(args.head_dim, args.heads_per_group, args.dtype)) {
    throw std::runtime_error("decode_attention: head dim 64 or 128, 1, 2, 4 or 8 query heads a key/value head, bf16 or fp16");
  }
  bool launched = false;
  auto with_dim = [&](auto type) {
    using T = decltype(type);
    launched = args.head_dim == 64 ? launch_for_heads<T, 64>(args, stream) : launch_for_heads<T, 128>(args, stream);
  };
  if (args.dtype == DType::BFloat16) with_dim(__nv_bfloat16{});
  else with_dim(__half{});
  if (!launched) throw std::runtime_error("decode_attention: no kernel for these heads");
  check_launch("decode_attention");
}

}  // namespace megatron::kernels::cuda
