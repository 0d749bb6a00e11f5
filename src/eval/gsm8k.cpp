#include "eval/gsm8k.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <regex>

#include "core/text.h"
#include "eval/metrics.h"
#include "inference/engine.h"
#include "tokenizer/tokenizer.h"

namespace megatron::eval {
namespace {

const char* kInvalid = "[invalid]";

}  // namespace

std::string gsm8k_prompt(const GenerationDoc& doc, const std::vector<GenerationDoc>& shots) {
  std::string prompt;
  for (const GenerationDoc& shot : shots) prompt += "Question: " + shot.question + "\nAnswer: " + shot.answer + "\n\n";
  return prompt + "Question: " + doc.question + "\nAnswer:";
}

std::string strict_match(const std::string& response) {
  static const std::regex pattern("#### (\\-?[0-9\\.\\,]+)");
  std::smatch m;
  if (!std::regex_search(response, m, pattern)) return kInvalid;
  return strip_whitespace(m[1].str());
}

std::string flexible_extract(const std::string& response) {
  static const std::regex pattern("(-?[$0-9.,]{2,})|(-?[0-9]+)");
  std::string last;
  bool found = false;
  for (auto it = std::sregex_iterator(response.begin(), response.end(), pattern); it != std::sregex_iterator(); ++it) {
    found = true;
    last = (*it)[1].matched && (*it)[1].length() > 0 ? (*it)[1].str() : (*it)[2].str();  // the first non-empty group
  }
  if (!found) return kInvalid;
  return last.empty() ? kInvalid : strip_whitespace(last);
}

std::string exact_match_normalize(const std::string& text) {
  std::string s;
  for (const char c : text) {  // "," and "\$"
    if (c != ',' && c != '$') s += c;
  }
  // "(?s).*#### ": everything up to the last "#### " (greedy, across lines).
  if (const size_t at = s.rfind("#### "); at != std::string::npos) s = s.substr(at + 5);
  // "\.$": a "." at the end, or before a final newline (Python's $).
  if (s.size() >= 2 && s.compare(s.size() - 2, 2, ".\n") == 0) {
    s.erase(s.size() - 2, 1);
  } else if (!s.empty() && s.back() == '.') {
    s.pop_back();
  }
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

GenerationTaskScore score_gsm8k(Engine& engine, const Tokenizer& tokenizer, const std::vector<GenerationDoc>& docs,
                                const std::vector<std::vector<GenerationDoc>>& shots, const std::vector<int64_t>& stop_ids,
                                int64_t max_new_tokens) {
  TORCH_CHECK(shots.size() == docs.size(), "score_gsm8k: ", shots.size(), " few-shot lists for ", docs.size(), " documents");
  std::vector<int64_t> ids;
  for (size_t i = 0; i < docs.size(); ++i) {
    GenerationRequest r;
    r.prompt = tokenizer.encode(gsm8k_prompt(docs[i], shots[i]), false);
    // lm-eval keeps the prompt's most recent tokens when it and the new ones pass the model's length.
    const size_t room = static_cast<size_t>(std::max<int64_t>(1, engine.max_length() - max_new_tokens));
    if (r.prompt.size() > room) r.prompt.erase(r.prompt.begin(), r.prompt.end() - static_cast<std::ptrdiff_t>(room));
    r.max_new_tokens = std::min(max_new_tokens, engine.max_length() - int64_t(r.prompt.size()));
    r.sampling.greedy = true;
    r.stop_ids = stop_ids;
    r.stop_strings = {"Question:", "</s>", "<|im_end|>"};
    ids.push_back(engine.submit(std::move(r)));
  }
  while (!engine.idle()) engine.step();
  GenerationTaskScore score;
  std::vector<double> strict, flexible;
  for (size_t i = 0; i < docs.size(); ++i) {
    GenerationDocScore d;
    d.response = engine.take_result(ids[i])->text;
    d.strict = strict_match(d.response);
    d.flexible = flexible_extract(d.response);
    const std::string reference = exact_match_normalize(docs[i].answer);
    d.strict_correct = exact_match_normalize(d.strict) == reference;
    d.flexible_correct = exact_match_normalize(d.flexible) == reference;
    strict.push_back(d.strict_correct ? 1.0 : 0.0);
    flexible.push_back(d.flexible_correct ? 1.0 : 0.0);
    score.per_doc.push_back(std::move(d));
  }
  score.docs = int64_t(docs.size());
  score.strict = mean(strict);
  score.flexible = mean(flexible);
  score.strict_stderr = mean_stderr(strict);
  score.flexible_stderr = mean_stderr(flexible);
  return score;
}

}  // namespace megatron::eval
