// Choosing the next token from a sequence's logits, with HF transformers' rules and order:
// repetition penalty, temperature, top-k, top-p, min-p, then a draw (or the argmax).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace megatron {

struct SamplingOptions {
  bool greedy = false;            // the argmax (as temperature 0)
  double temperature = 1.0;
  int64_t top_k = 0;              // 0: no top-k cut
  double top_p = 1.0;             // 1: no nucleus cut
  double min_p = 0.0;             // 0: no cut; else drop ids less likely than min_p x the most likely
  double repetition_penalty = 1.0;  // 1: none; else the logits of ids seen are divided (> 0) or multiplied (< 0) by it
  uint64_t seed = 1234;
};

// logits: [V] (any float dtype, any device). `seen`: the ids of the sequence so far (prompt and
// generated), for the repetition penalty. The ids left after the cuts are drawn from their
// softmax with `generator` (a CPU generator).
int64_t sample_next_token(const at::Tensor& logits, const SamplingOptions& options, at::Generator& generator,
                          const std::vector<int64_t>& seen = {});

}  // namespace megatron
