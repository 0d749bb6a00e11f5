// The generation engine: requests of any length share one forward per step over a key/value
// cache (model/kv_cache.h). A request is prefilled when it gets a slot (its whole prompt in one
// forward, shared with the requests right behind it whose prompts have its length), then
// decoded one token a step together with every other running request; requests that arrive
// while others run join at the next step, and a finished request's slot goes to the next one
// waiting (continuous batching).
//
//   Engine engine(model, {.max_batch = 8, .vocab_size = V});
//   const int64_t id = engine.submit(request);
//   while (!engine.idle()) engine.step();
//   GenerationResult r = engine.take_result(id);
//
// The engine is driven from one thread. Under tensor parallelism every TP rank runs the same
// engine on the same requests, in step (the logits gathered whole on each). Under pipeline
// parallelism every stage does too: a forward passes its hidden states from stage to stage and
// the last stage's logits are broadcast to the others (EngineOptions::pipeline).
#pragma once

#include <ATen/core/Generator.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "inference/decode_graphs.h"
#include "inference/sampling.h"
#include "inference/tokens_in_flight.h"
#include "model/kv_cache.h"

namespace megatron {

class GPTModel;

struct GenerationRequest {
  std::vector<int64_t> prompt;  // token ids, at least one
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  // Any of these ids ends the sequence (and is its last token), e.g. the tokenizer's EOS.
  std::vector<int64_t> stop_ids;
  // Any of these texts in the decoded continuation ends it; the text stops before it (needs
  // EngineOptions::detokenize).
  std::vector<std::string> stop_strings;
  // Called with each new id as it is chosen (streaming).
  std::function<void(int64_t)> on_token;
  // -1: no log-probabilities; n >= 0: each new token's, with the n most likely ids' (OpenAI's
  // `logprobs`). With prompt_logprobs the prompt's tokens get them too (OpenAI's `echo`).
  int64_t logprobs = -1;
  bool prompt_logprobs = false;
};

// A token's log-probability under the model (its raw distribution over the real vocabulary,
// before temperature and cuts, as vLLM reports by default) and the most likely ids' at its place.
struct TokenLogprob {
  double logprob = 0.0;
  std::vector<std::pair<int64_t, double>> top;  // most likely first
};

struct GenerationResult {
  std::vector<int64_t> tokens;  // the continuation's ids (a stop id included)
  std::string finish_reason;    // "stop" (a stop id or string) or "length" (max_new_tokens, or the model's length)
  std::string text;             // the continuation decoded, without a stop id, cut before a stop string (with detokenize only)
  std::vector<TokenLogprob> logprobs;         // per token of `tokens` (request.logprobs >= 0)
  std::vector<TokenLogprob> prompt_logprobs;  // per prompt token after the first (request.prompt_logprobs)
};

// Where the time went (wall time, each forward's logits read back to the host, so a GPU step has
// finished when it is counted).
struct EngineStats {
  int64_t prefill_tokens = 0;
  int64_t prefills = 0;  // prefill forwards (prompts of one length waiting together share one)
  double prefill_seconds = 0;
  int64_t decode_steps = 0;
  int64_t decode_tokens = 0;  // one per running sequence per step
  double decode_seconds = 0;  // the steps' time less the captures'
  int64_t graph_captures = 0;  // decode CUDA graphs captured (the first step of each batch size and key bound)
  double capture_seconds = 0;  // the host's time in those captures (not in decode_seconds)
  int64_t steps_ahead = 0;  // decode steps launched before the host had read the step before (decode_ahead)
};

struct EngineOptions {
  int64_t max_batch = 8;   // sequences decoded together (cache slots)
  int64_t max_length = 0;  // tokens one sequence may hold, prompt included; 0: the model's maximum length
  int64_t vocab_size = 0;  // candidate ids: [0, vocab_size) (the rest is Megatron's vocabulary padding); 0: all
  std::function<std::string(const std::vector<int64_t>&)> detokenize;  // for stop strings and result text
  // On a GPU: decode steps replayed from CUDA graphs where the model allows (decode_graphs.h), and
  // attention reading the key/value cache in place (SdpaAttention::forward_over_cache) in every
  // step. The commands turn it on on a GPU (--cuda-graph-impl auto, the default); measured on one
  // H200: 6.16 -> 1.75 ms a decode step at batch 1, 12.1 -> 2.15 ms at 64 (docs/performance.md).
  bool cuda_graphs = false;
  // Greedy decoding one step ahead (--decode-ahead): while every running sequence is greedy,
  // unpenalised and without log-probabilities, step n + 1 is launched fed step n's argmaxes on the
  // device before the host reads them, so on a GPU the host's per-step work (reading the tokens,
  // stop checks, the next launch) overlaps the device's. A sequence that ends at step n has its
  // row of step n + 1 dropped. The tokens are the ones a step-by-step run chooses. The commands
  // turn it on on a GPU (one H200, 1.1B shape: 1.96 -> 1.80 ms a step at batch 1, 2.30 -> 2.09 at 64).
  bool decode_ahead = false;
  // The newer decode kernels (model/kv_cache.h), off unless asked for: --attention-backend decode
  // and --decode-rope-in-gemv (with cuda_graphs, where attention reads the cache in place),
  // --decode-norms-in-gemv. The commands turn on, on one GPU, RoPE in the QKV GEMV (measured on an
  // H100: 1.52 -> 1.49 ms a batch-1 step), the norms in the GEMVs (1.093 -> 1.070 ms) and the
  // attention kernel where it measured faster than FA2 (docs/inference.md).
  DecodeKernels decode_kernels;
  // Chunked prefill (--enable-chunked-prefill): a prompt longer than this many tokens is prefilled
  // that many a step, one step's chunk between two decode steps of the running sequences, so they
  // keep decoding while it is read (and its activations stay a chunk's); prompts prefilled
  // together take at most this many tokens too. 0: every prompt in one forward.
  int64_t prefill_chunk = 0;
  // The pipeline stages (the model is this stage's chunk; its rank in the group is its stage):
  // each forward runs stage by stage, the hidden states [s, b, h] sent to the next, and the last
  // stage's logits broadcast to all, so every stage draws the same tokens. Default: one stage.
  dist::Group pipeline;
};

class Engine {
 public:
  Engine(GPTModel& model, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request; its id for take_result. A UserError (nothing queued) for an empty prompt,
  // an id outside the vocabulary, or prompt + max_new_tokens beyond max_length.
  int64_t submit(GenerationRequest request);
  // One step: the running requests each decode a token (one forward for all), then waiting
  // requests take the free slots and are prefilled (choosing their first token).
  void step();
  bool idle() const { return running_.empty() && waiting_.empty() && !chunked_; }
  // Drops a waiting or running request (its slot freed, no result kept); false if it is not
  // there (finished, or unknown).
  bool cancel(int64_t id);
  // A finished request's result (taken once); nullopt while it runs or waits.
  std::optional<GenerationResult> take_result(int64_t id);
  // Drops every finished result not taken (a follower rank of leading_engine.h never reads them).
  void discard_results() { finished_.clear(); }
  // Submits all, steps until every one has finished, and returns their results in order.
  std::vector<GenerationResult> generate(std::vector<GenerationRequest> requests);

  int64_t max_length() const { return cache_.capacity(); }
  // The sequences decoded together (the cache may hold one more slot: the decode graphs' scratch).
  int64_t max_batch() const { return max_batch_; }
  // How decode steps run: "CUDA graphs", or "eager" and why.
  const std::string& decode_mode() const { return decode_mode_; }
  // Which of the newer decode kernels asked for (EngineOptions::decode_kernels) the steps ran.
  const DecodeKernels& decode_kernels_run() const { return cache_.decode_kernels_run(); }
  const EngineStats& stats() const { return stats_; }
  // One throwaway greedy run of `prompt` for up to two tokens (within max_length; nothing when it
  // does not fit or the engine is busy), then the stats from zero: on a GPU a run's first forward
  // is cold (CUDA loads each kernel at its first launch), and this takes that cost before the
  // requests that count. Every tensor-parallel rank and pipeline stage calls it alike. -> seconds.
  double warm_up(const std::vector<int64_t>& prompt);

 private:
  struct Sequence {
    int64_t id;
    int64_t slot;
    GenerationRequest request;
    std::vector<int64_t> seen;  // prompt + continuation
    GenerationResult result;
    at::Generator generator;
    bool text_final = false;  // result.text already cut before a stop string
    int64_t prefilled = 0;    // prompt tokens in the cache so far (a prompt prefilled in chunks)
  };
  // A decode step launched and not yet read: its sequences (by id, in row order) and their tokens
  // on the way to the host.
  struct StepInFlight {
    std::vector<int64_t> ids;
    TokensInFlight tokens;
    int64_t row_of(int64_t id) const;  // the sequence's row, -1 when it has none
  };
  // The running sequences, in order.
  std::vector<Sequence*> running_sequences() const;
  // Whether every running sequence takes its argmax (argmax_is_enough).
  bool all_greedy() const;
  // One decode step of every running sequence, read at once.
  void decode_step();
  // One decode step of greedy sequences with the next launched before this one is read.
  void decode_ahead();
  // Launches a decode step of `sequences`, fed `tokens` [b] on the device, or (undefined) their
  // last tokens from the host; their argmaxes start towards the host.
  StepInFlight launch_greedy_step(const std::vector<Sequence*>& sequences, const at::Tensor& tokens);
  // The logits [b, V] of a decode step of the sequences in `slots`, fed `tokens` on the device or
  // else `last` from the host; the cache holds the new rows afterwards.
  at::Tensor decode_logits(const std::vector<int64_t>& slots, const at::Tensor& tokens, const std::vector<int64_t>& last);
  // Each running sequence's row in `step`; nullopt when one has none (it joined after the step
  // was launched). Rows of sequences that ended or were cancelled since are left out.
  std::optional<std::vector<int64_t>> rows_in(const StepInFlight& step) const;
  // Whether the step after the one in flight may be launched before that one is read: some
  // sequence may still be running after it, and every one has a row to spare.
  bool may_run_ahead() const;
  // Accepts `step`'s tokens for the sequences still running (joined ones had no row in it).
  void accept_step(StepInFlight& step);
  // Chooses the sequence's next token from its logits [V] (the real vocabulary); true once it
  // has finished.
  bool advance(Sequence& sequence, const at::Tensor& logits);
  // Takes `next` as the sequence's next token; `logits` [V] are needed only for its log-probabilities.
  bool accept(Sequence& sequence, int64_t next, const at::Tensor& logits);
  // Greedy, unpenalised and without log-probabilities: the argmax is the whole choice, taken on the
  // device for the batch at once instead of copying every row's logits to the host.
  static bool argmax_is_enough(const Sequence& sequence);
  // [..., V/tp] -> [..., V]: under tensor parallelism the vocabulary slices of every TP rank.
  at::Tensor whole_vocabulary(const at::Tensor& logits) const;
  // The model's forward over `step` (tokens [b, s]) through every pipeline stage -> the candidate
  // logits [s (1 with last_position_only), b, vocab_] on every stage.
  at::Tensor logits_of(const at::Tensor& tokens, KvCacheStep& step, bool last_position_only);
  // The prompts of a group of waiting requests in one forward (the shorter ones padded to the
  // longest: KvCacheStep's kept rows), each choosing its first token.
  void prefill(const std::vector<std::unique_ptr<Sequence>>& group);
  // The tokens one prefill forward takes at most when it holds several prompts (one prompt alone
  // may be longer): their activations live at once.
  static constexpr size_t kPrefillTokens = 8192;
  // The share of a prefill forward's tokens that may be padding: one forward instead of one per
  // prompt length, for at most this much more work.
  static constexpr double kPrefillPadding = 0.25;
  // The next chunk of the prompt being prefilled in chunks (EngineOptions::prefill_chunk); after
  // its last, the sequence chooses its first token and runs.
  void prefill_next_chunk();
  // Whether a stop string shows in the decoded text of the sequence's last tokens.
  bool stop_string_in_tail(const Sequence& s) const;
  void finish(Sequence& sequence);  // its slot freed, its result kept for take_result
  void release_slot(int64_t slot);   // the slot's cache rows dropped, the slot free for the next request

  GPTModel& model_;
  EngineOptions options_;
  // Where this stage's chunk lives, and the dtype of its hidden states and logits (its weights').
  struct ChunkWeights {
    at::Device device;
    at::ScalarType dtype;
  } weights_;
  static ChunkWeights weights_of(const GPTModel& model);
  int64_t vocab_;  // candidate ids [0, vocab_): options_.vocab_size, else the whole output layer
  int64_t max_batch_;
  std::string decode_mode_;
  // Whether prompts of different lengths may share a prefill: padding rows change no real
  // token's result, unless experts have a capacity (padding tokens could take real ones' places).
  bool pads_prompts_;
  KvCache cache_;  // max_batch_ slots, and the scratch slot of decode_graphs_ after them
  std::unique_ptr<DecodeGraphs> decode_graphs_;
  std::vector<int64_t> free_slots_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::unique_ptr<Sequence> chunked_;  // holds a slot, its prompt prefilled a chunk a step
  std::map<int64_t, GenerationResult> finished_;
  std::optional<StepInFlight> in_flight_;  // decode_ahead: launched, not read yet
  int64_t next_id_ = 0;
  EngineStats stats_;
};

// The model's maximum sequence length for generation: max_position_embeddings (learned
// positions), else the larger of it and seq_length.
int64_t model_max_length(const GPTModel& model);

// The log-probability of `id` under logits [V] and the `top` most likely ids'.
TokenLogprob token_logprob(const at::Tensor& log_probs, int64_t id, int64_t top);

}  // namespace megatron
