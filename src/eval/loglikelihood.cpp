#include "eval/loglikelihood.h"

#include "core/errors.h"
#include "inference/engine.h"
#include "tokenizer/tokenizer.h"

namespace megatron::eval {

std::pair<std::vector<int64_t>, std::vector<int64_t>> encode_pair(const Tokenizer& tokenizer, std::string context,
                                                                  std::string continuation) {
  const size_t kept = context.find_last_not_of(" \t\n\r\f\v");
  const size_t spaces = kept == std::string::npos ? context.size() : context.size() - kept - 1;
  if (spaces > 0) {
    continuation = context.substr(context.size() - spaces) + continuation;
    context.resize(context.size() - spaces);
  }
  const std::vector<int64_t> whole = tokenizer.encode(context + continuation, false);
  std::vector<int64_t> context_ids = tokenizer.encode(context, false);
  const size_t split = std::min(context_ids.size(), whole.size());
  return {std::move(context_ids), std::vector<int64_t>(whole.begin() + static_cast<std::ptrdiff_t>(split), whole.end())};
}

std::vector<Loglikelihood> loglikelihoods(Engine& engine, const std::vector<LoglikelihoodRequest>& requests, int64_t* truncated) {
  // Room for the one token the engine generates after the prompt.
  const size_t room = static_cast<size_t>(engine.max_length() - 1);
  std::vector<int64_t> ids;
  std::vector<size_t> context_lengths;
  int64_t cut = 0;
  for (const LoglikelihoodRequest& r : requests) {
    if (r.context.empty() || r.continuation.empty()) {
      throw UserError("eval: a request has an empty context or continuation (lm-eval conditions on at least one token)");
    }
    if (r.continuation.size() >= room) {
      throw UserError("eval: a continuation of " + std::to_string(r.continuation.size()) + " tokens leaves no context within the model's " +
                      std::to_string(engine.max_length()) + " tokens");
    }
    GenerationRequest g;
    g.prompt = r.context;
    g.prompt.insert(g.prompt.end(), r.continuation.begin(), r.continuation.end());
    size_t context = r.context.size();
    if (g.prompt.size() > room) {  // the oldest context ids go, as lm-eval truncates on the left
      const size_t drop = g.prompt.size() - room;
      g.prompt.erase(g.prompt.begin(), g.prompt.begin() + static_cast<std::ptrdiff_t>(drop));
      context -= drop;
      ++cut;
    }
    g.max_new_tokens = 1;
    g.sampling.greedy = true;
    g.prompt_logprobs = true;
    g.logprobs = 1;
    ids.push_back(engine.submit(std::move(g)));
    context_lengths.push_back(context);
  }
  while (!engine.idle()) engine.step();
  std::vector<Loglikelihood> out;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationResult result = *engine.take_result(ids[i]);
    // prompt_logprobs[j] is prompt token j + 1's.
    Loglikelihood ll{0.0, true};
    const auto& continuation = requests[i].continuation;
    for (size_t k = 0; k < continuation.size(); ++k) {
      const TokenLogprob& t = result.prompt_logprobs.at(context_lengths[i] - 1 + k);
      ll.logprob += t.logprob;
      ll.greedy = ll.greedy && !t.top.empty() && t.top.front().first == continuation[k];
    }
    out.push_back(ll);
  }
  if (truncated != nullptr) *truncated = cut;
  return out;
}

}  // namespace megatron::eval
