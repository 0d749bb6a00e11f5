// Multiple-choice scoring as lm-evaluation-harness defines it (output_type: multiple_choice):
// each choice's log-likelihood as the continuation " " + choice of the prompt; `acc` when the
// most likely choice is the gold one, `acc_norm` when it is after dividing each log-likelihood
// by its choice's length in characters; means over the documents with lm-eval's standard error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eval/loglikelihood.h"
#include "eval/metrics.h"
#include "eval/task_data.h"

namespace megatron::eval {

// lm-eval's prompt: the description, then each few-shot example as its text, " ", its gold
// choice and "\n\n", then the document's text.
std::string choice_context(const ChoiceDoc& doc, const std::vector<ChoiceDoc>& shots);

struct ChoiceDocScore {
  std::vector<Loglikelihood> choices;
  int64_t predicted = 0;       // argmax of the log-likelihoods (the first on a tie, as numpy's)
  int64_t predicted_norm = 0;  // argmax of log-likelihood / characters
};

struct ChoiceTaskScore {
  int64_t docs = 0;
  double acc = 0, acc_stderr = 0, acc_norm = 0, acc_norm_stderr = 0;  // stderr: NaN with one document
  int64_t truncated = 0;  // requests whose context lost its oldest tokens to the model's length
  std::vector<ChoiceDocScore> per_doc;
};

// shots[i]: the few-shot examples before document i (eval/fewshot.h draws them; none for
// zero-shot), one list per document.
ChoiceTaskScore score_multiple_choice(Engine& engine, const Tokenizer& tokenizer, const std::vector<ChoiceDoc>& docs,
                                      const std::vector<std::vector<ChoiceDoc>>& shots);

// Characters (code points) of UTF-8 text: Python's len(str).
int64_t utf8_length(const std::string& text);

}  // namespace megatron::eval
