#include "inference/generate.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

#include "core/errors.h"
#include "model/gpt_model.h"

namespace megatron {

int64_t sample_next_token(const at::Tensor& logits, const SamplingOptions& o, at::Generator& generator) {
  at::Tensor l = logits.to(at::kCPU, at::kFloat);  // [V]
  if (o.greedy || o.temperature <= 0.0) return l.argmax().item<int64_t>();
  l = l / o.temperature;
  if (o.top_k > 0 && o.top_k < l.size(0)) {
    const float kth = std::get<0>(l.topk(o.top_k)).min().item<float>();
    l = l.masked_fill(l < kth, -INFINITY);
  }
  if (o.top_p < 1.0) {
    auto [sorted, order] = l.sort(/*dim=*/0, /*descending=*/true);
    at::Tensor cumulative = sorted.softmax(0).cumsum(0);
    // Drop an id once the ids before it already reach top_p (the first id always stays).
    at::Tensor drop_sorted = (cumulative - sorted.softmax(0)) >= o.top_p;
    l = l.masked_fill(at::zeros_like(drop_sorted).scatter(0, order, drop_sorted), -INFINITY);
  }
  return at::multinomial(l.softmax(0), 1, /*replacement=*/false, generator).item<int64_t>();
}

std::vector<int64_t> generate(GPTModel& model, const std::vector<int64_t>& prompt, const SamplingOptions& o,
                              int64_t vocab_size, std::optional<int64_t> stop_id,
                              const std::function<void(int64_t)>& on_token) {
  if (prompt.empty()) throw UserError("generate: the prompt is empty (nothing to continue)");
  at::NoGradGuard no_grad;
  model.eval();
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const auto device = model.word_embeddings.device();
  const int64_t window = model.config().position_embedding_type == "learned_absolute"
                             ? model.config().max_position_embeddings
                             : std::max(model.config().seq_length, model.config().max_position_embeddings);
  std::vector<int64_t> ids = prompt;
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - window);
    std::vector<int64_t> context(ids.begin() + start, ids.end());
    at::Tensor tokens = at::tensor(context, at::kLong).view({1, -1}).to(device);  // [1, s]
    at::Tensor logits = model.forward(tokens);                                     // [s, 1, V]
    const int64_t next = sample_next_token(logits[-1][0].narrow(0, 0, vocab_size), o, generator);
    ids.push_back(next);
    if (on_token) on_token(next);
    if (stop_id && next == *stop_id) break;
  }
  return ids;
}

}  // namespace megatron
