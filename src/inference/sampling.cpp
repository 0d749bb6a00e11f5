#include "inference/sampling.h"

#include <ATen/ATen.h>

#include <cmath>
#include <set>

namespace megatron {

int64_t sample_next_token(const at::Tensor& logits, const SamplingOptions& o, at::Generator& generator,
                          const std::vector<int64_t>& seen) {
  at::Tensor l = logits.to(at::kCPU, at::kFloat);  // [V] (the caller's tensor when already CPU fp32)
  if (o.repetition_penalty != 1.0 && !seen.empty()) {
    l = l.clone();  // penalised in place below: not the caller's logits
    // HF's RepetitionPenaltyLogitsProcessor: each id seen once or more, penalised once.
    std::set<int64_t> distinct;
    for (int64_t id : seen) {
      if (id >= 0 && id < l.size(0)) distinct.insert(id);
    }
    const at::Tensor ids = at::tensor(std::vector<int64_t>(distinct.begin(), distinct.end()), at::kLong);
    const at::Tensor scores = l.index_select(0, ids);
    l.index_put_({ids}, at::where(scores < 0, scores * o.repetition_penalty, scores / o.repetition_penalty));
  }
  if (o.greedy || o.temperature <= 0.0) return l.argmax().item<int64_t>();
  l = l / o.temperature;
  if (o.top_k > 0 && o.top_k < l.size(0)) {
    const float kth = std::get<0>(l.topk(o.top_k)).min().item<float>();
    l = l.masked_fill(l < kth, -INFINITY);
  }
  if (o.top_p < 1.0) {
    auto [sorted, order] = l.sort(/*dim=*/0, /*descending=*/true);
    const at::Tensor probs = sorted.softmax(0);
    // Drop an id once the ids before it already reach top_p (the first id always stays).
    const at::Tensor drop_sorted = (probs.cumsum(0) - probs) >= o.top_p;
    l = l.masked_fill(at::zeros_like(drop_sorted).scatter(0, order, drop_sorted), -INFINITY);
  }
  if (o.min_p > 0.0) {
    const at::Tensor probs = l.softmax(0);
    l = l.masked_fill(probs < probs.max() * o.min_p, -INFINITY);
  }
  return at::multinomial(l.softmax(0), 1, /*replacement=*/false, generator).item<int64_t>();
}

}  // namespace megatron
