// Attention of one new token per sequence over its cached keys and values, read where they lie
// (generation's decode step; src/model/core_attention.cpp). FlashAttention-2's split-KV kernel and
// its combine took 12.7 us a layer on the 1.1B shape at batch 1 (two launches, 64-row query tiles
// for the 8 query heads of a group); here one launch, each block a 128-key chunk of one sequence's
// key/value head for all the query heads that share it, and the block that finishes a
// (sequence, head)'s last chunk combines the chunks' partial softmaxes.
#include "kernels/cuda_common.cuh"

#include <cmath>

namespace megatron::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kChunk = kWarps * 32;  // keys a block: one a lane

// P query heads share a key/value head; D channels a head. Grid: (chunks, G, b).
template <typename T, int D, int P>
__global__ void __launch_bounds__(kWarps * 32) decode_attention_kernel(DecodeAttentionArgs a) {
  constexpr int kPerLane = D / 32;  // value channels a lane accumulates
  constexpr int kVec = 8;           // key channels a 16-byte load
  const int chunk = blockIdx.x, group = blockIdx.y, seq = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int length = a.key_counts[seq];
  const int chunks = length > 0 ? (length + kChunk - 1) / kChunk : 1;
  if (chunk >= chunks) return;  // past the sequence's keys: no part in the combine
  const int64_t first_row = a.key_starts[seq];

  // The chunk's values are staged in shared memory (every load in flight at once, while the
  // scores are formed); the warps' partial outputs reuse that space afterwards.
  constexpr int kValueBytes = kChunk * D * int(sizeof(T)), kOutBytes = kWarps * P * D * int(sizeof(float));
  __shared__ float q_shared[P][D];
  __shared__ float warp_max[kWarps][P], warp_sum[kWarps][P];
  __shared__ alignas(16) unsigned char staged[kValueBytes > kOutBytes ? kValueBytes : kOutBytes];
  __shared__ bool last_block;
  T* values = reinterpret_cast<T*>(staged);                  // [kChunk, D]
  float* warp_out = reinterpret_cast<float*>(staged);        // [kWarps, P, D], after the values are used
  const int chunk_keys = min(kChunk, length - chunk * kChunk);
  for (int i = threadIdx.x; i < chunk_keys * (D / kVec); i += blockDim.x) {
    const int row = i / (D / kVec), c0 = (i % (D / kVec)) * kVec;
    *reinterpret_cast<Pack<T, kVec>*>(values + row * D + c0) = *reinterpret_cast<const Pack<T, kVec>*>(
        static_cast<const T*>(a.v) + (first_row + chunk * kChunk + row) * a.kv_stride_row + group * a.kv_stride_h + c0);
  }
  for (int i = threadIdx.x; i < P * D; i += blockDim.x) {
    const int p = i / D, c = i % D;
    q_shared[p][c] = a.scale * to_float(static_cast<const T*>(a.q)[seq * a.q_stride_b + (group * P + p) * a.q_stride_h + c]);
  }
  __syncthreads();

  // Scores (the scale is in q): lane = key.
  const int key = chunk * kChunk + warp * 32 + lane;
  const bool valid = key < length;
  float score[P];
#pragma unroll
  for (int p = 0; p < P; ++p) score[p] = 0.0f;
  if (valid) {
    const T* k_row = static_cast<const T*>(a.k) + (first_row + key) * a.kv_stride_row + group * a.kv_stride_h;
#pragma unroll
    for (int c0 = 0; c0 < D; c0 += kVec) {
      const Pack<T, kVec> kp = *reinterpret_cast<const Pack<T, kVec>*>(k_row + c0);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float kv = to_float(kp.v[j]);
#pragma unroll
        for (int p = 0; p < P; ++p) score[p] += q_shared[p][c0 + j] * kv;
      }
    }
  }
  // The warp's softmax statistics per query head; score[p] becomes this lane's key's weight.
  float top[P], total[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    float m = valid ? score[p] : -INFINITY;
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    top[p] = m;
    score[p] = valid ? __expf(score[p] - m) : 0.0f;  // m is finite wherever some lane is valid
    float sum = score[p];
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffff, sum, o);
    total[p] = sum;
  }
  // Weighted values: lane = channels [lane * kPerLane, ...), over the warp's keys.
  float out[P][kPerLane];
#pragma unroll
  for (int p = 0; p < P; ++p) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) out[p][i] = 0.0f;
  }
  const int warp_keys = max(0, min(32, chunk_keys - warp * 32));
  for (int j = 0; j < warp_keys; ++j) {
    const T* v_row = values + (warp * 32 + j) * D + lane * kPerLane;
    float vals[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) vals[i] = to_float(v_row[i]);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const float w = __shfl_sync(0xffffffff, score[p], j);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) out[p][i] += w * vals[i];
    }
  }
  if (lane == 0) {
#pragma unroll
    for (int p = 0; p < P; ++p) warp_max[warp][p] = warp_keys > 0 ? top[p] : -INFINITY, warp_sum[warp][p] = total[p];
  }
  __syncthreads();  // every warp is done with the staged values
#pragma unroll
  for (int p = 0; p < P; ++p) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) warp_out[(warp * P + p) * D + lane * kPerLane + i] = out[p][i];
  }
  __syncthreads();

  // The chunk's partial: max, sum and unnormalised output over its warps, into the workspace.
  const int64_t partial = (int64_t(seq) * a.groups + group) * a.max_chunks + chunk;  // [b, G, chunks]
  for (int i = threadIdx.x; i < P * D; i += blockDim.x) {
    const int p = i / D, c = i % D;
    float m = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, warp_max[w][p]);
    float s = 0.0f, o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (warp_max[w][p] == -INFINITY) continue;
      const float f = __expf(warp_max[w][p] - m);
      s += warp_sum[w][p] * f;
      o += warp_out[(w * P + p) * D + c] * f;
    }
    a.partial_out[(partial * P + p) * D + c] = o;
    if (c == 0) a.partial_max[partial * P + p] = m, a.partial_sum[partial * P + p] = s;
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

int64_t decode_attention_chunk() { return kChunk; }

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
