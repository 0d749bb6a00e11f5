#include "eval/fewshot.h"

#include "core/errors.h"

namespace megatron::eval {

FewshotSampler parse_fewshot_sampler(const std::string& name) {
  if (name == "first_n") return FewshotSampler::FirstN;
  if (name == "default") return FewshotSampler::Default;
  throw UserError("--fewshot-sampler " + name + ": expected first_n (the split's first N) or default (lm-eval's seeded random draw)");
}

std::string fewshot_sampler_name(FewshotSampler sampler) { return sampler == FewshotSampler::FirstN ? "first_n" : "default"; }

FewshotSampler lm_eval_sampler(TaskFormat format) {
  return format == TaskFormat::Mmlu || format == TaskFormat::Ceval ? FewshotSampler::FirstN : FewshotSampler::Default;
}

FewshotDraw::FewshotDraw(FewshotSampler sampler, size_t examples, int64_t num_fewshot, int64_t seed)
    : sampler_(sampler), examples_(examples), count_(size_t(num_fewshot)), random_(seed) {}

std::vector<size_t> FewshotDraw::next(const std::function<bool(size_t)>& is_doc) {
  if (count_ == 0) return {};
  if (!is_doc) {
    if (sampler_ == FewshotSampler::Default) return random_.sample(examples_, count_);
    std::vector<size_t> first(count_);
    for (size_t i = 0; i < count_; ++i) first[i] = i;
    return first;
  }
  auto too_few = [&](size_t others) {
    return UserError("the few-shot split is the evaluated one and holds " + std::to_string(others) +
                     " examples besides a document, fewer than --num-fewshot " + std::to_string(count_) +
                     (sampler_ == FewshotSampler::Default ? " (lm-eval draws one more than that and drops the document)" : ""));
  };
  // The split without the document's copies: the first N of it, or what a redraw draws from.
  auto others = [&] {
    std::vector<size_t> kept;
    for (size_t i = 0; i < examples_; ++i) {
      if (!is_doc(i)) kept.push_back(i);
    }
    return kept;
  };
  if (sampler_ == FewshotSampler::FirstN) {
    const std::vector<size_t> pool = others();
    if (pool.size() < count_) throw too_few(pool.size());
    return {pool.begin(), pool.begin() + std::ptrdiff_t(count_)};
  }
  if (count_ + 1 > examples_) throw too_few(others().size());
  std::vector<size_t> kept;
  for (size_t i : random_.sample(examples_, count_ + 1)) {
    if (!is_doc(i) && kept.size() < count_) kept.push_back(i);
  }
  if (kept.size() == count_) return kept;
  // Copies of the document drawn more than once: lm-eval draws again from the split without them.
  const std::vector<size_t> pool = others();
  if (pool.size() < count_) throw too_few(pool.size());
  kept.clear();
  for (size_t j : random_.sample(pool.size(), count_)) kept.push_back(pool[j]);
  return kept;
}

}  // namespace megatron::eval
