// lm-evaluation-harness's few-shot samplers (lm_eval/api/samplers.py, lm-eval 0.4.13): which
// examples of the few-shot split go before each document.
//  - first_n: the split's first N, in order (MMLU's and C-Eval's tasks);
//  - default: N drawn by random.sample from one random.Random(fewshot seed, 1234 by default) that
//    runs on from document to document in order (ARC, HellaSwag, GSM8K and tasks that say nothing).
// When the evaluated split is its own few-shot split, neither puts a document before itself:
// first_n skips its copies, default draws N + 1 and drops them (and draws again from the split
// without them if duplicates left fewer than N).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "eval/python_random.h"
#include "eval/task_data.h"

namespace megatron::eval {

enum class FewshotSampler { FirstN, Default };

// "first_n" or "default"; UserError naming --fewshot-sampler.
FewshotSampler parse_fewshot_sampler(const std::string& name);
std::string fewshot_sampler_name(FewshotSampler sampler);
// The sampler lm-eval's own task for the format uses: first_n for mmlu and ceval, else default.
FewshotSampler lm_eval_sampler(TaskFormat format);

class FewshotDraw {
 public:
  // `examples`: the few-shot split's size (at least num_fewshot: the caller checks).
  FewshotDraw(FewshotSampler sampler, size_t examples, int64_t num_fewshot, int64_t seed);

  // The examples (indices into the split) before the next document; call once per document, in
  // the documents' order. `is_doc(i)`: example i equals the document (the evaluated split is the
  // few-shot split), or null. UserError when the split leaves fewer than num_fewshot others.
  std::vector<size_t> next(const std::function<bool(size_t)>& is_doc);

 private:
  FewshotSampler sampler_;
  size_t examples_;
  size_t count_;
  PythonRandom random_;
};

}  // namespace megatron::eval
