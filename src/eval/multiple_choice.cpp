#include "eval/multiple_choice.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

#include "core/errors.h"
#include "tokenizer/tokenizer.h"

namespace megatron::eval {

std::string choice_context(const ChoiceDoc& doc, const std::vector<ChoiceDoc>& shots) {
  std::string context = doc.description;
  for (const ChoiceDoc& shot : shots) context += shot.text + " " + shot.choices.at(size_t(shot.gold)) + "\n\n";
  return context + doc.text;
}

int64_t utf8_length(const std::string& text) {
  int64_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

ChoiceTaskScore score_multiple_choice(Engine& engine, const Tokenizer& tokenizer, const std::vector<ChoiceDoc>& docs,
                                      const std::vector<std::vector<ChoiceDoc>>& shots) {
  TORCH_CHECK(shots.size() == docs.size(), "score_multiple_choice: ", shots.size(), " few-shot lists for ", docs.size(), " documents");
  std::vector<LoglikelihoodRequest> requests;
  for (size_t i = 0; i < docs.size(); ++i) {
    const ChoiceDoc& doc = docs[i];
    const std::string context = choice_context(doc, shots[i]);
    for (const std::string& choice : doc.choices) {
      auto [context_ids, continuation_ids] = encode_pair(tokenizer, context, " " + choice);
      if (context_ids.empty()) throw UserError("eval: a document's prompt encodes to no tokens: \"" + doc.text + "\"");
      if (continuation_ids.empty()) throw UserError("eval: the choice \"" + choice + "\" encodes to no tokens");
      requests.push_back({std::move(context_ids), std::move(continuation_ids)});
    }
  }
  ChoiceTaskScore score;
  const std::vector<Loglikelihood> lls = loglikelihoods(engine, requests, &score.truncated);
  std::vector<double> acc, acc_norm;
  size_t next = 0;
  for (const ChoiceDoc& doc : docs) {
    ChoiceDocScore d;
    d.choices.assign(lls.begin() + static_cast<std::ptrdiff_t>(next), lls.begin() + static_cast<std::ptrdiff_t>(next + doc.choices.size()));
    next += doc.choices.size();
    double best = -INFINITY, best_norm = -INFINITY;
    for (size_t c = 0; c < doc.choices.size(); ++c) {
      const double ll = d.choices[c].logprob;
      const double norm = ll / static_cast<double>(utf8_length(doc.choices[c]));
      if (ll > best) best = ll, d.predicted = int64_t(c);
      if (norm > best_norm) best_norm = norm, d.predicted_norm = int64_t(c);
    }
    acc.push_back(d.predicted == doc.gold ? 1.0 : 0.0);
    acc_norm.push_back(d.predicted_norm == doc.gold ? 1.0 : 0.0);
    score.per_doc.push_back(std::move(d));
  }
  score.docs = int64_t(docs.size());
  score.acc = mean(acc);
  score.acc_norm = mean(acc_norm);
  score.acc_stderr = mean_stderr(acc);
  score.acc_norm_stderr = mean_stderr(acc_norm);
  return score;
}

}  // namespace megatron::eval
