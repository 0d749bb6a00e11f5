#include "inference/decode_graphs.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "core/errors.h"
#include "model/core_attention.h"
#include "model/gpt_model.h"
#include "model/kv_cache.h"
#include "moe/moe_config.h"

#ifdef MEGATRON_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#endif

namespace megatron {

std::string decode_graphs_unsupported(const GPTModel& model, const c10::Device& device) {
  if (!device.is_cuda()) return "the model runs on " + device.str();
#ifndef MEGATRON_WITH_CUDA_KERNELS
  return "this build has no CUDA support";
#endif
  const ModelConfig& c = model.config();
  if (model.tensor_parallel().size() > 1) return "not yet under tensor parallelism";
  if (c.num_experts > 0) {
    const std::string why = moe::route_reads_host(c, model.word_embeddings.scalar_type() == at::kBFloat16);
    if (!why.empty()) return "a mixture of experts: " + why;
  }
  if (c.multi_latent_attention) return "multi-latent attention gathers its cache";
  const int64_t head_dim = c.head_dim() > 0 ? c.head_dim() : c.hidden_size / c.num_attention_heads;
  const at::Tensor probe = at::empty({1, 1, 1, head_dim}, model.word_embeddings.options());
  if (!flash_attention_reads_cache(probe, probe)) {
    return "attention gathers its cache here (flash attention reads it in place in bf16 or fp16, head dims a multiple of 8 up to "
           "256, on compute capability 8.0 or newer)";
  }
  return "";
}

int64_t decode_graph_key_bound(int64_t needed, int64_t capacity) {
  int64_t keys = 64;  // the shortest bound (then 128, 256, ...)
  while (keys < needed) keys *= 2;
  return std::min(keys, capacity);
}

#ifdef MEGATRON_WITH_CUDA_KERNELS

namespace {

// One batch size's graph and the tensors it reads and writes (their addresses are in it).
struct Graph {
  std::unique_ptr<KvCacheStep> step;
  at::Tensor tokens;  // [b, 1] int64: the step's input, copied in before each replay
  at::Tensor logits;  // [b, V/tp]: its output, rewritten by each replay
  at::cuda::CUDAGraph graph;
};

}  // namespace

struct DecodeGraphs::State {
  State(GPTModel& m, KvCache& c, int64_t scratch, const c10::Device& d)
      : model(m), cache(c), scratch_slot(scratch), device(d), pool(at::cuda::graph_pool_handle()) {}
  GPTModel& model;
  KvCache& cache;
  int64_t scratch_slot;
  c10::Device device;
  at::cuda::MempoolId_t pool;  // shared: the graphs never run at once
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Graph>> graphs;  // by batch size and keys attended
  int64_t captures = 0;  // tried, failed ones too
  double capture_seconds = 0;

  Graph& capture(int64_t batch, int64_t keys);
  // The graph for a step of the sequences in `slots` (the smallest batch of 1, 2, 4, ... that
  // holds them, attending to the smallest of 64, 128, 256, ... keys, at most the cache's
  // capacity, that holds the longest after its new token), captured at its
  // first use; null, with `failure` saying why, when the capture fails.
  Graph* graph_for(const std::vector<int64_t>& slots, std::string& failure);
};

Graph& DecodeGraphs::State::capture(int64_t batch, int64_t keys) {
  auto g = std::make_unique<Graph>();
  g->step = KvCacheStep::fixed_decode(cache, batch, scratch_slot, device, keys);  // every row on the scratch slot
  g->tokens = at::zeros({batch, 1}, at::TensorOptions().dtype(at::kLong).device(device));
  // Capture needs a stream other than the default one; replays run on the caller's stream. The
  // side stream reads what the current one just wrote (the tokens' zeros, the step's buffers), so
  // the device is synchronized first; the steps in flight finish with it, so the time counted
  // from here is the capture's alone (theirs stays in the engine's decode time). The eager run
  // first makes what capture must not (cuBLAS's workspace for the stream, RoPE tables of the
  // cache's length); it writes the scratch slot's first row only.
  c10::cuda::device_synchronize();
  struct Timed {  // counts the capture however it ends
    State& s;
    std::chrono::steady_clock::time_point began;
    ~Timed() {
      s.captures += 1;
      s.capture_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    }
  } timed{*this, std::chrono::steady_clock::now()};
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    model.forward_cached(g->tokens, *g->step);
    side.synchronize();
    g->graph.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    try {
      g->logits = model.forward_cached(g->tokens, *g->step)[0];  // [b, V/tp]
      g->graph.capture_end();
    } catch (const std::exception& e) {
      try {
        g->graph.capture_end();  // leaves the stream usable; the capture is invalid anyway
      } catch (...) {
      }
      throw std::runtime_error(std::string("capturing a decode step of ") + std::to_string(batch) + " sequences failed: " + e.what());
    }
    side.synchronize();
  }
  return *(graphs[{batch, keys}] = std::move(g));
}

DecodeGraphs::DecodeGraphs(GPTModel& model, KvCache& cache, int64_t scratch_slot, const c10::Device& device) {
  const std::string why = decode_graphs_unsupported(model, device);
  if (!why.empty()) throw UserError("CUDA graphs for decoding: " + why + "; run with --cuda-graph-impl none");
  TORCH_CHECK(scratch_slot >= 0 && scratch_slot < cache.slots() && cache.slots() >= 2, "DecodeGraphs: scratch slot ", scratch_slot,
              " of ", cache.slots());
  state_ = std::make_unique<State>(model, cache, scratch_slot, device);
}

DecodeGraphs::~DecodeGraphs() = default;

Graph* DecodeGraphs::State::graph_for(const std::vector<int64_t>& slots, std::string& failure) {
  const int64_t n = static_cast<int64_t>(slots.size()), most = cache.slots() - 1;  // all but the scratch slot
  TORCH_CHECK(n >= 1 && n <= most, "DecodeGraphs::run: ", n, " sequences, ", most, " slots");
  int64_t batch = 1;
  while (batch < n) batch *= 2;
  batch = std::min(batch, most);
  // Attention's work and its split over blocks follow the longest sequence the kernel is told
  // of, not the real lengths it reads on the device: a step of short sequences in a long cache
  // would launch blocks for keys nobody holds (the kernels bench, session 35, one H100: FA2 told
  // of the bound 1.2-1.9x faster below 1,024 keys at 1 and 16 sequences), and the attention
  // backend is chosen by it (decode_attention_chosen). Every batch size: the illegal address the
  // kernels bench met at 64 sequences (sessions 35 and 44) was its own cross-stream race.
  int64_t needed = 1;
  for (int64_t slot : slots) needed = std::max(needed, cache.length(slot) + 1);
  const int64_t keys = decode_graph_key_bound(needed, cache.capacity());
  if (auto it = graphs.find({batch, keys}); it != graphs.end()) return it->second.get();
  try {
    return &capture(batch, keys);
  } catch (const std::exception& e) {
    failure = e.what();  // nothing was written but the scratch slot: the caller runs the step eagerly
    return nullptr;
  }
}

namespace {

// Refills the step's slots and lengths, replays, and commits the new tokens to the cache.
at::Tensor replay(Graph& g, const std::vector<int64_t>& slots, bool non_blocking) {
  g.step->assign(slots, non_blocking);
  g.graph.replay();
  g.step->commit();
  return g.logits.narrow(0, 0, static_cast<int64_t>(slots.size()));
}

}  // namespace

int64_t DecodeGraphs::captures() const { return state_->captures; }
double DecodeGraphs::capture_seconds() const { return state_->capture_seconds; }

at::Tensor DecodeGraphs::run(const std::vector<int64_t>& slots, const std::vector<int64_t>& tokens) {
  TORCH_CHECK(tokens.size() == slots.size(), "DecodeGraphs::run: ", slots.size(), " sequences, ", tokens.size(), " tokens");
  Graph* g = state_->graph_for(slots, failure_);
  if (g == nullptr) return {};
  std::vector<int64_t> padded = tokens;
  padded.resize(static_cast<size_t>(g->tokens.size(0)), 0);
  g->tokens.copy_(at::tensor(padded, at::kLong).view({-1, 1}));
  return replay(*g, slots, /*non_blocking=*/false);
}

at::Tensor DecodeGraphs::run(const std::vector<int64_t>& slots, const at::Tensor& tokens) {
  const int64_t n = static_cast<int64_t>(slots.size());
  TORCH_CHECK(tokens.dim() == 1 && tokens.size(0) == n && tokens.scalar_type() == at::kLong, "DecodeGraphs::run: tokens ", tokens.sizes(),
              " for ", n, " sequences");
  Graph* g = state_->graph_for(slots, failure_);
  if (g == nullptr) return {};
  // The rows past n keep what they held: they decode the scratch slot, whatever its token.
  g->tokens.narrow(0, 0, n).copy_(tokens.view({n, 1}), /*non_blocking=*/true);
  return replay(*g, slots, /*non_blocking=*/true);
}

#else  // a build without CUDA

struct DecodeGraphs::State {};

DecodeGraphs::DecodeGraphs(GPTModel& model, KvCache&, int64_t, const c10::Device& device) {
  throw UserError("CUDA graphs for decoding: " + decode_graphs_unsupported(model, device) + "; run with --cuda-graph-impl none");
}
DecodeGraphs::~DecodeGraphs() = default;
at::Tensor DecodeGraphs::run(const std::vector<int64_t>&, const std::vector<int64_t>&) { return {}; }
at::Tensor DecodeGraphs::run(const std::vector<int64_t>&, const at::Tensor&) { return {}; }
int64_t DecodeGraphs::captures() const { return 0; }
double DecodeGraphs::capture_seconds() const { return 0; }

#endif

}  // namespace megatron
