// Decode steps (one new token for each running sequence) replayed from CUDA graphs. At batch 1 a
// step's few hundred kernels take longer to launch than to run (measured on the 1.1B shape: 624
// launches, 10.6 ms a step, 1.4 ms of it kernels); a graph replay launches them all at once.
//
// One graph per batch size of 1, 2, 4, ... up to the engine's slots and bound
// on the keys attended of 64, 128, 256, ... up to the cache's capacity, captured at its first use:
// a step of b sequences replays the smallest batch that holds b, its other rows decoding the
// cache's scratch slot, with the smallest bound that holds its longest sequence. What makes a step replayable:
// fixed shapes (the graph's batch; attention reads up to the graph's bound, the real lengths on
// the device: KvCacheStep::fixed_decode), inputs
// copied into tensors that keep their addresses, and nothing in the step waiting for the host.
// Where a model's step cannot be captured (a mixture of experts outside the bf16 grouped GEMM
// counts its tokens per expert on the host; attention that gathers the cache),
// decode_graphs_unsupported() says why and the engine runs its steps eagerly; so it does, with a
// warning, when a capture fails.
// On by default on a GPU (--cuda-graph-impl auto; none turns it off): 3.5x the eager step's speed
// on the 1.1B shape at batch 1 on an H200 (docs/performance.md).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace at {
class Tensor;
}

namespace megatron {

class GPTModel;
class KvCache;

// Why the model's decode steps cannot be replayed from CUDA graphs on `device`; empty when they can.
std::string decode_graphs_unsupported(const GPTModel& model, const c10::Device& device);

// The keys a decode graph attends to when its longest sequence holds
// `needed` after the step's token, in a cache of `capacity` a sequence: the smallest of 64, 128,
// 256, ... that holds them, at most the capacity.
int64_t decode_graph_key_bound(int64_t needed, int64_t capacity);

class DecodeGraphs {
 public:
  // `scratch_slot`: a slot of `cache` that no sequence holds. Throws UserError unless this is a
  // CUDA build and decode_graphs_unsupported() is empty.
  DecodeGraphs(GPTModel& model, KvCache& cache, int64_t scratch_slot, const c10::Device& device);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // One decode step: sequence i (in `slots`, distinct, at most the cache's slots but the scratch)
  // takes `tokens[i]` as its next token. Returns the logits [b, V/tp] on the device (the graph's
  // tensor: read it before the next run); the cache holds the new tokens from now on. Undefined,
  // with nothing done, when the step could not be captured: failure() says why.
  at::Tensor run(const std::vector<int64_t>& slots, const std::vector<int64_t>& tokens);
  // The same with the tokens [b] (int64) already on the device (the step before's choice): nothing
  // in it waits for the device, so the host can go on while the step before still runs.
  at::Tensor run(const std::vector<int64_t>& slots, const at::Tensor& tokens);
  const std::string& failure() const { return failure_; }
  // The graphs captured so far (each batch size and key bound's first step) and the host's time
  // in those captures: one-off costs, kept out of the engine's per-step decode time.
  int64_t captures() const;
  double capture_seconds() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::string failure_;
};

}  // namespace megatron
