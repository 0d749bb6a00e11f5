// lm-evaluation-harness's loglikelihood requests, answered by the generation engine: the
// log-probability of a continuation given its context, summed over the continuation's tokens,
// and whether greedy decoding would have produced it. The engine computes it as the server
// answers lm-eval's `local-completions` (echo + logprobs over the prompt), so both give the same
// numbers.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace megatron {
class Engine;
class Tokenizer;
}  // namespace megatron

namespace megatron::eval {

// lm-eval's split of context + continuation into ids: the context's trailing spaces move to the
// continuation; the whole text is encoded once (no special tokens) and the context's own
// encoding's length marks where the continuation begins.
std::pair<std::vector<int64_t>, std::vector<int64_t>> encode_pair(const Tokenizer& tokenizer, std::string context,
                                                                  std::string continuation);

struct LoglikelihoodRequest {
  std::vector<int64_t> context;       // at least one id
  std::vector<int64_t> continuation;  // at least one id
};

struct Loglikelihood {
  double logprob = 0.0;  // sum over the continuation's tokens
  bool greedy = false;   // every continuation token was the most likely one
};

// Each request's log-likelihood, `max_batch` prefills in flight. A context longer than the model
// allows loses its oldest ids, as lm-eval truncates; `truncated` counts those requests.
std::vector<Loglikelihood> loglikelihoods(Engine& engine, const std::vector<LoglikelihoodRequest>& requests,
                                          int64_t* truncated = nullptr);

}  // namespace megatron::eval
