// The decode step's own kernels against what they replace, each timed as the engine runs it:
// inside a CUDA graph (20 calls captured once, the graph replayed), so launch latency is what a
// replay pays, not the host's. (1) Attention of one new token a sequence over the cache:
// kernels::decode_attention against FlashAttention-2's variable-length call with the same store
// (ATen's _flash_attention_forward, which picks its split-KV kernel and combine). (2) The one-row
// linear layer: kernels::gemv against at::linear (cuBLAS) for the layers of the 1.1B reference
// shape and of Llama 3 8B. Prints microseconds a call and the ratio, kernel / replaced.
//   megatron_bench_decode_kernels [--iters N]
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/attention_ops.h"
#include "kernels/gemv_ops.h"

namespace {

using namespace megatron;

constexpr int kCallsAGraph = 20;

// Microseconds a call of `work`, captured kCallsAGraph times into one graph and replayed `iters` times.
double graph_microseconds(const std::function<void()>& work, int iters) {
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  const c10::cuda::CUDAStreamGuard on_side(side);
  work();  // anything capture must not do (workspaces, lazy init) happens here
  side.synchronize();
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  for (int i = 0; i < kCallsAGraph; ++i) work();
  graph.capture_end();
  graph.replay();
  side.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) graph.replay();
  side.synchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / (iters * kCallsAGraph);
}

struct AttentionShape {
  const char* name;
  int64_t heads, groups, dim;
};

void attention_table(int iters) {
  std::printf("decode attention, one new token a sequence (us a layer; graph replays):\n");
  std::printf("| shape | batch | keys a sequence | FA2 split-KV + combine | decode_attention | kernel / FA2 |\n|---|---|---|---|---|---|\n");
  const at::TensorOptions o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  for (const AttentionShape& shape : {AttentionShape{"1.1B (32 heads, 4 kv, d 64)", 32, 4, 64},
                                      AttentionShape{"Llama 3 8B (32 heads, 8 kv, d 128)", 32, 8, 128}}) {
    for (int64_t b : {1, 16, 64}) {
      for (int64_t length : {512, 2048, 8192}) {
        const int64_t capacity = length;  // a slot per sequence, full
        const at::Tensor q = at::randn({b, shape.heads, shape.dim}, o);
        const at::Tensor k_store = at::randn({b * capacity, shape.groups, shape.dim}, o);
        const at::Tensor v_store = at::randn({b * capacity, shape.groups, shape.dim}, o);
        const at::Tensor key_starts = at::arange(b + 1, o.dtype(at::kInt)) * capacity;
        const at::Tensor key_counts = at::full({b}, length, o.dtype(at::kInt));
        const at::Tensor query_starts = at::arange(b + 1, o.dtype(at::kInt));
        const at::Tensor counters = at::zeros({b * shape.groups}, o.dtype(at::kInt));
        const double scale = 1.0 / std::sqrt(double(shape.dim));
        const double flash = graph_microseconds(
            [&] {
              at::_flash_attention_forward(q, k_store, v_store, query_starts, key_starts, 1, capacity, 0.0, /*is_causal=*/true,
                                           /*return_debug_mask=*/false, scale, std::nullopt, std::nullopt, key_counts);
            },
            iters);
        const double kernel = graph_microseconds(
            [&] { kernels::decode_attention(q, k_store, v_store, key_starts, key_counts, capacity, scale, counters); }, iters);
        std::printf("| %s | %lld | %lld | %.2f | %.2f | %.3f |\n", shape.name, (long long)b, (long long)length, flash, kernel, kernel / flash);
      }
    }
  }
}

struct LinearShape {
  const char* name;
  int64_t out, in;
};

void linear_table(int iters) {
  std::printf("\none-row linear layers, bf16 (us a call; GB/s of weight read):\n");
  std::printf("| layer | out x in | cuBLAS (at::linear) | GB/s | gemv | GB/s | gemv / cuBLAS |\n|---|---|---|---|---|---|---|\n");
  const at::TensorOptions o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const c10::NoGradGuard no_grad;
  for (const LinearShape& shape : {LinearShape{"1.1B qkv", 2560, 2048}, LinearShape{"1.1B proj", 2048, 2048},
                                   LinearShape{"1.1B fc1", 11264, 2048}, LinearShape{"1.1B fc2", 2048, 5632},
                                   LinearShape{"1.1B output", 32000, 2048}, LinearShape{"8B qkv", 6144, 4096},
                                   LinearShape{"8B proj", 4096, 4096}, LinearShape{"8B fc1", 28672, 4096},
                                   LinearShape{"8B fc2", 4096, 14336}, LinearShape{"8B output", 128256, 4096}}) {
    const at::Tensor x = at::randn({1, 1, shape.in}, o), weight = at::randn({shape.out, shape.in}, o);
    const double bytes = double(shape.out) * double(shape.in) * 2.0;
    const double cublas = graph_microseconds([&] { at::linear(x, weight); }, iters);
    const double gemv = graph_microseconds([&] { kernels::gemv(x, weight, {}); }, iters);
    std::printf("| %s | %lld x %lld | %.2f | %.0f | %.2f | %.0f | %.3f |\n", shape.name, (long long)shape.out, (long long)shape.in, cublas,
                bytes / cublas / 1e3, gemv, bytes / gemv / 1e3, gemv / cublas);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--iters") == 0) iters = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s (flags: --iters N)\n", argv[i]);
      return 2;
    }
  }
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "megatron_bench_decode_kernels needs a CUDA device\n");
    return 1;
  }
  attention_table(iters);
  linear_table(iters);
  return 0;
}
