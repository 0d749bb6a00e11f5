// The one-row linear layer of a batch-1 decode step, kernels::gemv, against at::linear (cuBLAS) for
// the layers of the 1.1B reference shape and of Llama 3 8B, timed as the engine runs them: inside
// a CUDA graph (20 calls captured once, the graph replayed), so launch latency is what a replay
// pays, and each call reading a weight of its own (the step's weights do not stay in L2). Prints
// microseconds a call, the weight bytes streamed a second and the ratio gemv / cuBLAS; then the
// projections of a whole 1.1B step with and without programmatic dependent launch, and with the
// layer's RMSNorms as kernels of their own or in the GEMVs; then decode
// attention over the cache in place, kernels::decode_attention against FA2's varlen kernel as
// SdpaAttention calls it (the grid sized for the cache's capacity, and for the smaller bound a
// decode graph of that length attends to), each call over a cache of its own; then the greedy
// choice over a step's logits, kernels::argmax_rows against at::argmax.
//   megatron_bench_decode_kernels [--iters N] [--only linear|step|attention|argmax] [--batches 1,16,64]
//                                 [--attention-calls both|fa2|decode]
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "inference/decode_graphs.h"
#include "kernels/attention_ops.h"
#include "kernels/gemv_ops.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"

namespace {

using namespace megatron;

constexpr int kCallsAGraph = 20;

// Microseconds a call of `work`, captured kCallsAGraph times into one graph and replayed `iters` times.
double graph_microseconds(const std::function<void()>& work, int iters) {
  // The inputs were made on the default stream and `work` runs on another: without this it may
  // read them before they are written (the attention table's key offsets from at::arange queued
  // behind 2.7 GB of at::randn at 64 sequences: the illegal address FA2 met there in sessions 35
  // and 44; with this, every row ran in session 45), and its first timings overlap their making.
  c10::cuda::device_synchronize();
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

struct LinearShape {
  const char* name;
  int64_t out, in;
};

// kernels::cuda::gemv on tensors, launched to overlap the kernel before or not.
at::Tensor raw_gemv(const at::Tensor& x, const at::Tensor& weight, bool gated, bool overlap) {
  at::Tensor y = at::empty({1, 1, gated ? weight.size(0) / 2 : weight.size(0)}, x.options());  // [1, 1, n]
  kernels::cuda::GemvArgs a{};
  a.x = x.data_ptr(), a.w = weight.data_ptr(), a.bias = nullptr, a.y = y.data_ptr();
  a.dtype = kernels::cuda::DType::BFloat16;
  a.n = y.size(-1), a.k = weight.size(1), a.w_stride = weight.stride(0);
  a.gated = gated, a.overlap_previous = overlap;
  kernels::cuda::gemv(a, c10::cuda::getCurrentCUDAStream().stream());
  return y;
}

void linear_table(int iters) {
  std::printf("one-row linear layers, bf16 (us a call; GB/s of weight read; gemv launched to overlap the last call):\n");
  std::printf("| layer | out x in | cuBLAS (at::linear) | GB/s | gemv | GB/s | gemv / cuBLAS |\n|---|---|---|---|---|---|---|\n");
  const at::TensorOptions o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const c10::NoGradGuard no_grad;
  for (const LinearShape& shape : {LinearShape{"1.1B qkv", 2560, 2048}, LinearShape{"1.1B proj", 2048, 2048},
                                   LinearShape{"1.1B fc1", 11264, 2048}, LinearShape{"1.1B fc2", 2048, 5632},
                                   LinearShape{"1.1B output", 32000, 2048}, LinearShape{"8B qkv", 6144, 4096},
                                   LinearShape{"8B proj", 4096, 4096}, LinearShape{"8B fc1", 28672, 4096},
                                   LinearShape{"8B fc2", 4096, 14336}, LinearShape{"8B output", 128256, 4096}}) {
    // A weight of its own for each call of the graph, as a step's layers are: one weight read
    // 20 times in a row would come from L2 (50 MB on an H100) and flatter both.
    const at::Tensor x = at::randn({1, 1, shape.in}, o);
    std::vector<at::Tensor> weights;
    for (int i = 0; i <= kCallsAGraph; ++i) weights.push_back(at::randn({shape.out, shape.in}, o));
    const double bytes = double(shape.out) * double(shape.in) * 2.0;
    size_t next = 0;
    const double cublas = graph_microseconds([&] { at::linear(x, weights[next++ % weights.size()]); }, iters);
    if (!kernels::gemv_takes(x, weights[0], {})) {  // past the GEMV's longest reduction: cuBLAS's
      std::printf("| %s | %lld x %lld | %.2f | %.0f | (cuBLAS) | | |\n", shape.name, (long long)shape.out, (long long)shape.in, cublas,
                  bytes / cublas / 1e3);
      continue;
    }
    const double gemv = graph_microseconds([&] { kernels::gemv(x, weights[next++ % weights.size()], {}); }, iters);
    std::printf("| %s | %lld x %lld | %.2f | %.0f | %.2f | %.0f | %.3f |\n", shape.name, (long long)shape.out, (long long)shape.in, cublas,
                bytes / cublas / 1e3, gemv, bytes / gemv / 1e3, gemv / cublas);
    std::fflush(stdout);
  }
}

// The projections of a whole 1.1B decode step (22 layers: QKV, output, fc1 with SwiGLU, fc2),
// each layer's weights its own (2 GB: nothing stays in L2), in one graph as the engine replays
// them: cuBLAS with the SwiGLU kernel, the GEMVs launched the ordinary way, and the GEMVs
// launched to overlap the kernel before (weights streaming while the last layer finishes).
void step_table(int iters) {
  constexpr int kLayers = 22;
  constexpr int64_t h = 2048, qkv = 2560, f = 5632;
  const at::TensorOptions o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const c10::NoGradGuard no_grad;
  struct Layer {
    at::Tensor qkv, proj, fc1, fc2;
  };
  std::vector<Layer> layers;
  for (int i = 0; i < kLayers; ++i) {
    layers.push_back({at::randn({qkv, h}, o) * 0.02, at::randn({h, h}, o) * 0.02, at::randn({2 * f, h}, o) * 0.02, at::randn({h, f}, o) * 0.02});
  }
  const at::Tensor x0 = at::randn({1, 1, h}, o);
  const at::Tensor gamma = at::rand({h}, o) + 0.5;
  const double bytes = double(kLayers) * double(qkv * h + h * h + 2 * f * h + h * f) * 2.0;
  // 0: cuBLAS, 1: gemv, 2: gemv overlapping; with the layer's two residual adds + RMSNorms, 3: as
  // kernels of their own (the default step), 4: in the GEMVs after them (session 42's
  // --decode-norms-in-gemv), 5: prepared in the epilogues of the GEMVs before them and finished in
  // the GEMVs after (--decode-norms-in-gemv since session 43).
  auto step = [&](int mode) {
    at::Tensor x = x0;
    at::Tensor base = x0, delta = x0;  // the residual stream
    std::optional<kernels::PreparedNorm> prepared;  // mode 5: the stream with its next norm half done
    for (const Layer& l : layers) {
      if (mode == 5) {
        at::Tensor a;  // the QKV output [1, 1, qkv]
        if (prepared) a = kernels::gemv_after_prepared_norm(*prepared, l.qkv, {}, false);
        else a = kernels::gemv_after_norm(base, delta, gamma, 1e-6, l.qkv, {}, false).y;  // the first layer: from the embedding
        const kernels::PreparedNorm attended =
            kernels::gemv_into_norm(a.narrow(-1, 0, h).contiguous(), l.proj, prepared ? prepared->sum : base, gamma, 1e-6);
        prepared = kernels::gemv_into_norm(kernels::gemv_after_prepared_norm(attended, l.fc1, {}, true), l.fc2, attended.sum, gamma, 1e-6);
      } else if (mode == 3) {
        const kernels::AddRmsNorm hn = kernels::add_rms_norm(base, delta, gamma, 1e-6);
        const at::Tensor m = kernels::gemv(kernels::gemv(hn.normed, l.qkv, {}).narrow(-1, 0, h).contiguous(), l.proj, {});
        const kernels::AddRmsNorm xn = kernels::add_rms_norm(hn.sum, m, gamma, 1e-6);
        base = xn.sum, delta = kernels::gemv(kernels::linear_swiglu(xn.normed, l.fc1), l.fc2, {});
      } else if (mode == 4) {
        const kernels::NormedLinear a = kernels::gemv_after_norm(base, delta, gamma, 1e-6, l.qkv, {}, false);
        const at::Tensor m = kernels::gemv(a.y.narrow(-1, 0, h).contiguous(), l.proj, {});
        const kernels::NormedLinear up = kernels::gemv_after_norm(a.sum, m, gamma, 1e-6, l.fc1, {}, true);
        base = up.sum, delta = kernels::gemv(up.y, l.fc2, {});
      } else if (mode == 0) {
        const at::Tensor a = at::linear(x, l.qkv).narrow(-1, 0, h);
        const at::Tensor m = at::linear(a.contiguous(), l.proj);
        x = at::linear(kernels::swiglu(at::linear(m, l.fc1)), l.fc2);
      } else {
        const at::Tensor a = raw_gemv(x, l.qkv, false, mode == 2).narrow(-1, 0, h);
        const at::Tensor m = raw_gemv(a.contiguous(), l.proj, false, mode == 2);
        x = raw_gemv(raw_gemv(m, l.fc1, true, mode == 2), l.fc2, false, mode == 2);
      }
    }
  };
  std::printf("\nthe projections of a 1.1B decode step (22 layers, %.2f GB of weights; the kernels of one step in a graph):\n", bytes / 1e9);
  std::printf("| kernels | us a step | GB/s | / cuBLAS |\n|---|---|---|---|\n");
  double cublas = 0.0;
  const char* names[] = {"cuBLAS + SwiGLU kernel", "gemv (fc1 gated), ordinary launches", "gemv, overlapping launches",
                         "gemv overlapping + 2 add+RMSNorm kernels a layer", "gemv overlapping, the norms in the GEMVs after them",
                         "gemv overlapping, the norms prepared in the GEMVs before them"};
  for (int mode : {0, 1, 2, 3, 4, 5}) {
    const double us = graph_microseconds([&] { step(mode); }, iters);
    if (mode == 0) cublas = us;
    std::printf("| %s | %.1f | %.0f | %.3f |\n", names[mode], us, bytes / us / 1e3, us / cublas);
    std::fflush(stdout);
  }
}

// Attention of q [b, H, d] over the first `keys` rows of each sequence's `capacity` in the stores
// [b * capacity, G, d], in fp32 (GQA: query head h reads group h / (H / G)): the reference where
// the table leaves FA2 out.
at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& k_store, const at::Tensor& v_store, int64_t capacity, int64_t keys,
                               double scale) {
  const int64_t b = q.size(0), heads = q.size(1), groups = k_store.size(1), d = q.size(2);
  auto held = [&](const at::Tensor& store) {  // [b, H, keys, d]
    return store.view({b, capacity, groups, d}).narrow(1, 0, keys).to(at::kFloat).permute({0, 2, 1, 3}).repeat_interleave(heads / groups, 1);
  };
  const at::Tensor scores = at::matmul(q.to(at::kFloat).unsqueeze(2), held(k_store).transpose(2, 3)) * scale;  // [b, H, 1, keys]
  return at::matmul(scores.softmax(-1), held(v_store)).squeeze(2).to(q.scalar_type());  // [b, H, d]
}

// The 1.1B shape's attention (32 query heads in 4 KV groups of 64 channels) for b sequences
// holding `keys` keys each in a cache of 2048 a sequence, each kernel told of the whole capacity
// (as one decode graph for every length would) and of the bound a decode graph of that length
// attends to (the smallest of 64, 128, ... that holds the keys: DecodeGraphs).
// calls: "both", or "fa2" / "decode" to time one kernel alone.
void attention_table(int iters, const std::vector<int64_t>& batches, const std::string& calls) {
  const at::TensorOptions bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::TensorOptions i32 = bf16.dtype(at::kInt);
  const int64_t heads = 32, groups = 4, d = 64, capacity = 2048;
  const double scale = 1.0 / 8.0;
  std::printf("\ndecode attention over the cache (1.1B heads, capacity %lld): us a call, told of the capacity / of the graph's bound\n",
              (long long)capacity);
  std::printf("| batch | keys | FA2 | FA2, bound | decode | decode, bound | decode, bound / FA2, bound | max gap |\n|---|---|---|---|---|---|---|---|\n");
  for (int64_t b : batches) {
    for (int64_t keys : {128, 256, 400, 512, 1024, 2048}) {
      const int64_t bound = decode_graph_key_bound(keys, capacity);
      std::vector<at::Tensor> k_stores, v_stores;
      for (int i = 0; i < kCallsAGraph; ++i) {
        k_stores.push_back(at::randn({b * capacity, groups, d}, bf16));  // [slots * capacity, G, d]
        v_stores.push_back(at::randn({b * capacity, groups, d}, bf16));
      }
      const at::Tensor q = at::randn({b, heads, d}, bf16);  // [b, H, d]
      const at::Tensor key_starts = at::arange(b + 1, i32) * capacity;
      const at::Tensor key_counts = at::full({b}, keys, i32);
      const at::Tensor query_starts = at::arange(b + 1, i32);
      const at::Tensor tickets = at::zeros({kernels::decode_attention_tickets(b, groups)}, i32);
      auto flash = [&](int64_t longest) {
        int call = 0;
        return graph_microseconds([&] {
          const int i = call++ % kCallsAGraph;
          at::_flash_attention_forward(q, k_stores[i], v_stores[i], query_starts, key_starts, 1, longest, 0.0, true, false, scale,
                                       std::nullopt, std::nullopt, key_counts);
        }, iters);
      };
      auto decode = [&](int64_t longest) {
        int call = 0;
        return graph_microseconds([&] {
          const int i = call++ % kCallsAGraph;
          kernels::decode_attention(q, k_stores[i], v_stores[i], key_starts, key_counts, longest, scale, tickets);
        }, iters);
      };
      // Each call named on stderr before it runs: a fault surfaces at graph_microseconds' own
      // synchronizes, after its call's name.
      auto timed = [&](const char* what, const std::function<double(int64_t)>& call, int64_t longest) {
        std::fprintf(stderr, "[attention] batch %lld, %lld keys: %s told of %lld\n", (long long)b, (long long)keys, what, (long long)longest);
        return call(longest);
      };
      const bool with_flash = calls != "decode", with_decode = calls != "fa2";
      const double none = std::nan("");
      const double flash_whole = with_flash ? timed("FA2", flash, capacity) : none, flash_bound = with_flash ? timed("FA2", flash, bound) : none;
      const double decode_whole = with_decode ? timed("decode kernel", decode, capacity) : none;
      const double decode_bound = with_decode ? timed("decode kernel", decode, bound) : none;
      // The outputs side by side once, at the bound, against FA2 told of the capacity (bf16: a gap
      // of a few 1e-3 is rounding; a wrong merge is O(1)); the reference in fp32 where FA2 is left out.
      const at::Tensor want = with_flash ? std::get<0>(at::_flash_attention_forward(q, k_stores[0], v_stores[0], query_starts, key_starts, 1,
                                                                                    capacity, 0.0, true, false, scale, std::nullopt,
                                                                                    std::nullopt, key_counts))
                                         : reference_attention(q, k_stores[0], v_stores[0], capacity, keys, scale);
      double gap = 0.0;
      if (with_decode) {
        const at::Tensor got = kernels::decode_attention(q, k_stores[0], v_stores[0], key_starts, key_counts, bound, scale, tickets);
        gap = std::max(gap, (got.to(at::kFloat) - want.view_as(got).to(at::kFloat)).abs().max().item<double>());
      }
      if (with_flash) {
        const at::Tensor flash_got = std::get<0>(at::_flash_attention_forward(q, k_stores[0], v_stores[0], query_starts, key_starts, 1, bound,
                                                                              0.0, true, false, scale, std::nullopt, std::nullopt, key_counts));
        gap = std::max(gap, (flash_got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>());
      }
      std::printf("| %lld | %lld | %.2f | %.2f | %.2f | %.2f | %.3f | %.2e |\n", (long long)b, (long long)keys, flash_whole, flash_bound,
                  decode_whole, decode_bound, decode_bound / flash_bound, gap);
      std::fflush(stdout);
    }
  }
}

// The greedy choice of a decode step over its logits (32000 ids; bf16, as the engine's) for 1, 16
// and 64 sequences: kernels::argmax_rows (one block a row) against at::argmax, each call over
// logits of its own; the two answers compared once.
void argmax_table(int iters) {
  const at::TensorOptions bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  std::printf("\ngreedy choice over 32000 logits a sequence: us a call\n");
  std::printf("| batch | at::argmax | argmax_rows | argmax_rows / at::argmax | same answers |\n|---|---|---|---|---|\n");
  for (int64_t b : {1, 16, 64}) {
    std::vector<at::Tensor> logits;
    for (int i = 0; i < kCallsAGraph; ++i) logits.push_back(at::randn({b, 32000}, bf16));
    auto timed = [&](const std::function<at::Tensor(const at::Tensor&)>& choose) {
      int call = 0;
      return graph_microseconds([&] { (void)choose(logits[size_t(call++ % kCallsAGraph)]); }, iters);
    };
    const double aten = timed([](const at::Tensor& x) { return x.argmax(-1); });
    const double ours = timed([](const at::Tensor& x) { return kernels::argmax_rows(x); });
    const bool same = at::equal(kernels::argmax_rows(logits[0]), logits[0].argmax(-1));
    std::printf("| %lld | %.2f | %.2f | %.3f | %s |\n", (long long)b, aten, ours, ours / aten, same ? "yes" : "NO");
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 50;
  std::string only;  // linear | step | attention | argmax; all when empty
  std::vector<int64_t> batches = {1, 4, 16, 64};  // the attention table's
  std::string calls = "both";                     // the attention table's: both, fa2 or decode
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--iters") == 0) {
      iters = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--only") == 0) {
      only = argv[i + 1];
    } else if (std::strcmp(argv[i], "--batches") == 0) {
      batches.clear();
      for (const char* p = argv[i + 1]; *p != '\0';) {
        char* end = nullptr;
        const long long b = std::strtoll(p, &end, 10);
        if (end == p || b < 1 || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "--batches %s: a comma-separated list of positive batch sizes, e.g. 1,16,64\n", argv[i + 1]);
          return 2;
        }
        batches.push_back(b);
        p = *end == ',' ? end + 1 : end;
      }
    } else if (std::strcmp(argv[i], "--attention-calls") == 0 &&
               (std::strcmp(argv[i + 1], "both") == 0 || std::strcmp(argv[i + 1], "fa2") == 0 || std::strcmp(argv[i + 1], "decode") == 0)) {
      calls = argv[i + 1];
    } else {
      std::fprintf(stderr, "unknown flag or value %s %s (flags: --iters N, --only linear|step|attention|argmax, --batches 1,16,64, "
                   "--attention-calls both|fa2|decode)\n", argv[i], argv[i + 1]);
      return 2;
    }
  }
  if (!at::hasCUDA()) {
    std::fprintf(stderr, "megatron_bench_decode_kernels needs a CUDA device\n");
    return 1;
  }
  if (only.empty() || only == "linear") linear_table(iters);
  if (only.empty() || only == "step") step_table(std::max(iters / 10, 3));
  if (only.empty() || only == "attention") attention_table(iters, batches, calls);
  if (only.empty() || only == "argmax") argmax_table(iters);
  return 0;
}
