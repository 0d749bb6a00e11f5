// Text generation from a GPTModel: next-token sampling (greedy, temperature, top-k, top-p) and
// an autoregressive loop. No KV cache yet: each step re-runs the (bounded) context.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

namespace megatron {

class GPTModel;

struct SamplingOptions {
  int64_t max_new_tokens = 64;
  bool greedy = false;
  double temperature = 1.0;
  int64_t top_k = 0;    // 0: no top-k cut
  double top_p = 1.0;   // 1: no nucleus cut
  uint64_t seed = 1234;
};

// logits: [V] (any float dtype). Greedy takes the argmax; otherwise the distribution is
// tempered, cut to the top-k ids and to the smallest set whose probability reaches top_p, and
// sampled with `generator`.
int64_t sample_next_token(const at::Tensor& logits, const SamplingOptions& options, at::Generator& generator);

// Extends `prompt` by up to max_new_tokens ids, stopping after `stop_id` if given. Only the first
// `vocab_size` logits are candidates (the rest is Megatron's vocabulary padding). `on_token` is
// called with each new id as it is produced (for streaming output).
std::vector<int64_t> generate(GPTModel& model, const std::vector<int64_t>& prompt, const SamplingOptions& options,
                              int64_t vocab_size, std::optional<int64_t> stop_id,
                              const std::function<void(int64_t)>& on_token = {});

}  // namespace megatron
