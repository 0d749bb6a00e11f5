// GSM8K as lm-evaluation-harness's `gsm8k` task scores it (generate_until): few-shot prompts of
// "Question: ...\nAnswer: <worked answer>", greedy generation until "Question:", "</s>",
// "<|im_end|>" or EOS (256 new tokens at most), the answer taken by its two filters (strict-match:
// the number after "#### "; flexible-extract: the last number of the response), and exact match
// against the reference's number after lm-eval's normalisation (commas, "$", a final "." dropped,
// lower case).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/task_data.h"

namespace megatron {
class Engine;
class Tokenizer;
}  // namespace megatron

namespace megatron::eval {

std::string gsm8k_prompt(const GenerationDoc& doc, const std::vector<GenerationDoc>& shots);
// lm-eval's filters: the extracted answer, or "[invalid]".
std::string strict_match(const std::string& response);
std::string flexible_extract(const std::string& response);
// lm-eval's exact_match preprocessing for this task (regexes_to_ignore, ignore_case).
std::string exact_match_normalize(const std::string& text);

struct GenerationDocScore {
  std::string response;  // the generated text, cut before a stop string
  std::string strict, flexible;
  bool strict_correct = false, flexible_correct = false;
};

struct GenerationTaskScore {
  int64_t docs = 0;
  double strict = 0, strict_stderr = 0, flexible = 0, flexible_stderr = 0;
  std::vector<GenerationDocScore> per_doc;
};

// shots[i]: the few-shot examples before document i (eval/fewshot.h; none for zero-shot), one list
// per document; stop_ids:
// the tokenizer's EOS (lm-eval stops there too); max_new_tokens: lm-eval's max_gen_toks.
GenerationTaskScore score_gsm8k(Engine& engine, const Tokenizer& tokenizer, const std::vector<GenerationDoc>& docs,
                                const std::vector<std::vector<GenerationDoc>>& shots, const std::vector<int64_t>& stop_ids,
                                int64_t max_new_tokens = 256);

}  // namespace megatron::eval
