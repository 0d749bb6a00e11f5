#include "inference/engine.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "core/errors.h"
#include "kernels/ops.h"
#include "model/gpt_model.h"
#include "tensor_parallel/mappings.h"

namespace megatron {
namespace {

// cuDNN's attention builds an execution plan for each new key length, tens of milliseconds on the
// host; a decode step has a new key length every time (measured: 63 ms a step on the 1.1B shape,
// 1.4 ms of it kernels). Its other backends need no plan. Restores the user's setting after.
class CudnnAttentionOff {
 public:
  CudnnAttentionOff() : was_(at::globalContext().userEnabledCuDNNSDP()) { at::globalContext().setSDPUseCuDNN(false); }
  ~CudnnAttentionOff() { at::globalContext().setSDPUseCuDNN(was_); }
  CudnnAttentionOff(const CudnnAttentionOff&) = delete;
  CudnnAttentionOff& operator=(const CudnnAttentionOff&) = delete;

 private:
  bool was_;
};

}  // namespace

int64_t model_max_length(const GPTModel& model) {
  const ModelConfig& c = model.config();
  if (c.position_embedding_type == "learned_absolute") return c.max_position_embeddings;
  return std::max<int64_t>(c.seq_length, c.max_position_embeddings);
}

TokenLogprob token_logprob(const at::Tensor& log_probs, int64_t id, int64_t top) {
  TokenLogprob out;
  out.logprob = log_probs[id].item<double>();
  if (top > 0) {
    auto [values, ids] = log_probs.topk(std::min<int64_t>(top, log_probs.size(0)));
    for (int64_t i = 0; i < values.size(0); ++i) out.top.emplace_back(ids[i].item<int64_t>(), values[i].item<double>());
  }
  return out;
}

namespace {

constexpr const char* kCudaGraphs = "CUDA graphs";

// `values` as an int64 tensor on `device`; on a GPU copied from pinned memory without waiting
// for the stream's earlier work.
at::Tensor to_device_without_waiting(const std::vector<int64_t>& values, const at::Device& device) {
  const at::Tensor host = at::tensor(values, at::kLong);
  if (!device.is_cuda()) return host.to(device);
  return host.pin_memory().to(device, /*non_blocking=*/true);
}

std::string decode_mode_of(const GPTModel& model, const EngineOptions& options, const at::Device& device) {
  if (!options.cuda_graphs) return "eager";
  if (options.pipeline.size() > 1) return "eager (not yet under pipeline parallelism)";
  const std::string why = decode_graphs_unsupported(model, device);
  return why.empty() ? kCudaGraphs : "eager (" + why + ")";
}

}  // namespace

// The device and dtype of the chunk's weights (a middle pipeline stage has no embedding); a
// parameter kept in fp32 under bf16 (a router's) says nothing of the activations.
Engine::ChunkWeights Engine::weights_of(const GPTModel& model) {
  for (const auto& item : model.named_parameters()) {
    if (!model.parameter_table().at(item.key()).keep_fp32) return {item.value().device(), item.value().scalar_type()};
  }
  TORCH_CHECK(false, "generation: the model chunk holds no weights");
}

Engine::Engine(GPTModel& model, EngineOptions options)
    : model_(model),
      options_(std::move(options)),
      weights_(weights_of(model)),
      vocab_(options_.vocab_size > 0 ? options_.vocab_size : model.config().padded_vocab_size),
      max_batch_(std::max<int64_t>(1, options_.max_batch)),
      decode_mode_(decode_mode_of(model, options_, weights_.device)),
      pads_prompts_(model.config().moe_expert_capacity_factor <= 0.0),
      cache_(static_cast<int64_t>(model.layers.size()), max_batch_ + (decode_mode_ == kCudaGraphs ? 1 : 0),
             options_.max_length > 0 ? options_.max_length : model_max_length(model)) {
  if (options_.max_batch < 1) throw UserError("generation: the batch of sequences must hold at least one, got " + std::to_string(options_.max_batch));
  for (int64_t slot = max_batch_ - 1; slot >= 0; --slot) free_slots_.push_back(slot);
  model_.eval();
  cache_.use_decode_kernels(options_.decode_kernels);
  if (cache_.slots() > max_batch_) decode_graphs_ = std::make_unique<DecodeGraphs>(model_, cache_, /*scratch_slot=*/max_batch_, weights_.device);
}

Engine::~Engine() = default;

int64_t Engine::submit(GenerationRequest request) {
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  if (prompt == 0) throw UserError("generation: the prompt is empty (nothing to continue)");
  if (request.max_new_tokens < 1) throw UserError("generation: max_new_tokens must be at least 1, got " + std::to_string(request.max_new_tokens));
  for (int64_t id : request.prompt) {
    if (id < 0 || id >= vocab_) {
      throw UserError("generation: prompt token id " + std::to_string(id) + " is outside the vocabulary (" + std::to_string(vocab_) + " ids)");
    }
  }
  if (prompt + request.max_new_tokens > max_length()) {
    throw UserError("generation: the prompt's " + std::to_string(prompt) + " tokens and " + std::to_string(request.max_new_tokens) +
                    " new ones exceed the model's maximum length of " + std::to_string(max_length()) +
                    " tokens; shorten the prompt or ask for fewer new tokens");
  }
  if (!request.stop_strings.empty() && !options_.detokenize) {
    throw UserError("generation: stop strings need a tokenizer to decode the continuation");
  }
  const uint64_t seed = request.sampling.seed;
  auto sequence = std::make_unique<Sequence>(Sequence{next_id_++, -1, std::move(request), {}, {},
                                                      at::make_generator<at::CPUGeneratorImpl>(seed)});
  sequence->seen = sequence->request.prompt;
  waiting_.push_back(std::move(sequence));
  return waiting_.back()->id;
}

void Engine::step() {
  at::NoGradGuard no_grad;
  const CudnnAttentionOff no_cudnn_attention;
  if (!running_.empty()) {
    const auto began = std::chrono::steady_clock::now();
    const double captured_before = stats_.capture_seconds;
    if (options_.decode_ahead && all_greedy()) {
      decode_ahead();
    } else {
      if (in_flight_) accept_step(*in_flight_);  // a sampled request joined: back to step by step
      in_flight_.reset();
      if (!running_.empty()) decode_step();
    }
    // A step that captured a graph counts as the replays after it will take: the capture is a
    // one-off cost, reported apart (HF's compiled generate is timed after its warm-up likewise).
    stats_.decode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count() -
                             (stats_.capture_seconds - captured_before);
  }
  if (running_.empty()) in_flight_.reset();  // its rows all belong to finished sequences
  // A long prompt's next chunk (prefill_chunk): one a step, so running sequences keep decoding.
  const bool chunk_ran = chunked_ != nullptr;
  if (chunked_) prefill_next_chunk();
  const size_t chunk = options_.prefill_chunk > 0 ? size_t(options_.prefill_chunk) : SIZE_MAX;
  const size_t most_tokens = std::min(kPrefillTokens, chunk);
  while (!waiting_.empty() && !free_slots_.empty()) {
    if (waiting_.front()->request.prompt.size() > chunk) {
      // A prompt longer than a chunk: prefilled a chunk a step, one such prompt at a time (another
      // waits for it, and so do the prompts behind that one: first come, first served); its first
      // chunk in a step that ran none. Short prompts behind a prompt being chunked are prefilled
      // meanwhile, from the next step.
      if (chunked_ || chunk_ran) break;
      chunked_ = std::move(waiting_.front());
      waiting_.pop_front();
      chunked_->slot = free_slots_.back();
      free_slots_.pop_back();
      prefill_next_chunk();
      break;
    }
    // The first waiting request and those right behind it share one forward (first come, first
    // served), up to the free slots and kPrefillTokens (or a chunk), the shorter prompts padded to
    // the longest while padding stays within kPrefillPadding of the forward's tokens.
    std::vector<std::unique_ptr<Sequence>> group;
    size_t longest = 0, real = 0;
    while (!waiting_.empty() && !free_slots_.empty()) {
      const size_t length = waiting_.front()->request.prompt.size();
      const size_t padded_longest = std::max(longest, length), rows = (group.size() + 1) * padded_longest;
      if (!group.empty() && (rows > most_tokens || (!pads_prompts_ && length != longest) ||
                             double(rows - real - length) > kPrefillPadding * double(rows))) {
        break;
      }
      longest = padded_longest;
      real += length;
      group.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      group.back()->slot = free_slots_.back();
      free_slots_.pop_back();
    }
    prefill(group);
    for (auto& sequence : group) {
      if (sequence->slot >= 0) running_.push_back(std::move(sequence));
    }
  }
}

void Engine::prefill_next_chunk() {
  const auto began = std::chrono::steady_clock::now();
  Sequence& sequence = *chunked_;
  const GenerationRequest& r = sequence.request;
  const int64_t length = int64_t(r.prompt.size()), from = sequence.prefilled;
  const int64_t n = std::min(options_.prefill_chunk, length - from);
  const bool last = from + n == length;
  KvCacheStep step(cache_, {sequence.slot}, n, weights_.device);  // after the chunks before it
  if (options_.cuda_graphs) step.allow_reading_in_place();
  const std::vector<int64_t> ids(r.prompt.begin() + from, r.prompt.begin() + from + n);
  const at::Tensor tokens = at::tensor(ids, at::kLong).view({1, n}).to(weights_.device);  // [1, n]
  const at::Tensor logits = logits_of(tokens, step, !r.prompt_logprobs).select(1, 0);  // [n or 1, V]
  step.commit();
  sequence.prefilled += n;
  stats_.prefill_tokens += n;
  stats_.prefills += 1;
  if (r.prompt_logprobs) {
    // Row i predicts prompt token from + i + 1 (the last chunk's last row: the first new token).
    const int64_t rows = last ? n - 1 : n;
    const at::Tensor log_probs = logits.narrow(0, 0, rows).to(at::kCPU, at::kFloat).log_softmax(-1);  // [rows, V]
    for (int64_t i = 0; i < rows; ++i) {
      sequence.result.prompt_logprobs.push_back(token_logprob(log_probs[i], r.prompt[size_t(from + i + 1)], std::max<int64_t>(r.logprobs, 0)));
    }
  }
  if (last) {
    std::unique_ptr<Sequence> done = std::move(chunked_);
    if (advance(*done, logits[-1])) {
      finish(*done);
    } else {
      running_.push_back(std::move(done));
    }
  }
  stats_.prefill_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
}

at::Tensor Engine::decode_logits(const std::vector<int64_t>& slots, const at::Tensor& tokens, const std::vector<int64_t>& last) {
  at::Tensor logits;  // [b, V]
  if (decode_graphs_) {
    const int64_t captures = decode_graphs_->captures();
    const double capture_seconds = decode_graphs_->capture_seconds();
    logits = tokens.defined() ? decode_graphs_->run(slots, tokens) : decode_graphs_->run(slots, last);
    stats_.graph_captures += decode_graphs_->captures() - captures;
    stats_.capture_seconds += decode_graphs_->capture_seconds() - capture_seconds;
    if (logits.defined()) return logits.narrow(1, 0, vocab_);
    decode_mode_ = "eager (" + decode_graphs_->failure() + ")";
    std::fprintf(stderr, "warning: decode steps run eagerly from now on: %s\n", decode_graphs_->failure().c_str());
    decode_graphs_.reset();
  }
  KvCacheStep decode(cache_, slots, 1, weights_.device);
  if (options_.cuda_graphs) decode.allow_reading_in_place();
  const at::Tensor fed = tokens.defined() ? tokens.view({-1, 1}) : at::tensor(last, at::kLong).view({-1, 1}).to(weights_.device);  // [b, 1]
  logits = logits_of(fed, decode, true)[0];
  decode.commit();
  return logits;
}

std::vector<Engine::Sequence*> Engine::running_sequences() const {
  std::vector<Sequence*> sequences;
  for (const auto& s : running_) sequences.push_back(s.get());
  return sequences;
}

bool Engine::all_greedy() const {
  return std::all_of(running_.begin(), running_.end(), [](const auto& s) { return argmax_is_enough(*s); });
}

void Engine::decode_step() {
  // One token for every running sequence, in one forward over the cache.
  if (all_greedy()) {
    // Only the batch's argmaxes [b] come to the host, not its logits.
    StepInFlight step = launch_greedy_step(running_sequences(), {});
    return accept_step(step);
  }
  std::vector<int64_t> slots, last;
  for (const auto& s : running_) {
    slots.push_back(s->slot);
    last.push_back(s->seen.back());
  }
  const at::Tensor rows = decode_logits(slots, {}, last).to(at::kCPU, at::kFloat);  // [b, V]
  std::vector<std::unique_ptr<Sequence>> still;
  for (size_t i = 0; i < running_.size(); ++i) {
    if (advance(*running_[i], rows[static_cast<int64_t>(i)])) {
      finish(*running_[i]);
    } else {
      still.push_back(std::move(running_[i]));
    }
  }
  running_ = std::move(still);
  stats_.decode_steps += 1;
  stats_.decode_tokens += static_cast<int64_t>(slots.size());
}

void Engine::decode_ahead() {
  const std::vector<Sequence*> everyone = running_sequences();
  std::optional<std::vector<int64_t>> rows;  // each running sequence's row in the step in flight
  if (in_flight_) {
    rows = rows_in(*in_flight_);
    if (!rows) {
      // Requests joined since it was launched: its tokens for those it holds, then a step of
      // everyone from the host's tokens, read by the next call.
      accept_step(*in_flight_);
      in_flight_.reset();
      if (!running_.empty()) in_flight_ = launch_greedy_step(running_sequences(), {});
      return;
    }
  } else {
    in_flight_ = launch_greedy_step(everyone, {});
    rows = rows_in(*in_flight_);
  }
  // The next step, fed this one's argmaxes on the device (the rows of those still running), goes
  // in before the host waits for them.
  std::optional<StepInFlight> next;
  if (may_run_ahead()) {
    const at::Tensor& chosen = in_flight_->tokens.on_device();  // [rows of the step in flight]
    bool same_rows = rows->size() == in_flight_->ids.size();
    for (size_t i = 0; i < rows->size() && same_rows; ++i) same_rows = (*rows)[i] == static_cast<int64_t>(i);
    next = launch_greedy_step(everyone, same_rows ? chosen : chosen.index_select(0, to_device_without_waiting(*rows, chosen.device())));
    stats_.steps_ahead += 1;
  }
  accept_step(*in_flight_);
  in_flight_ = std::move(next);
}

Engine::StepInFlight Engine::launch_greedy_step(const std::vector<Sequence*>& sequences, const at::Tensor& tokens) {
  std::vector<int64_t> ids, slots, last;
  for (const Sequence* s : sequences) {
    ids.push_back(s->id);
    slots.push_back(s->slot);
    last.push_back(s->seen.back());
  }
  const at::Tensor logits = decode_logits(slots, tokens, last);  // [b, V]
  return StepInFlight{std::move(ids), TokensInFlight(kernels::argmax_rows(logits))};  // [b] on the device
}

int64_t Engine::StepInFlight::row_of(int64_t id) const {
  const auto row = std::find(ids.begin(), ids.end(), id);
  return row == ids.end() ? -1 : row - ids.begin();
}

std::optional<std::vector<int64_t>> Engine::rows_in(const StepInFlight& step) const {
  std::vector<int64_t> rows;
  for (const auto& s : running_) {
    rows.push_back(step.row_of(s->id));
    if (rows.back() < 0) return std::nullopt;
  }
  return rows;
}

bool Engine::may_run_ahead() const {
  bool someone_goes_on = false;
  for (const auto& s : running_) {
    // After the step in flight it holds one token more; the step ahead writes that token's row.
    if (static_cast<int64_t>(s->seen.size()) + 1 >= cache_.capacity()) return false;
    someone_goes_on = someone_goes_on || static_cast<int64_t>(s->result.tokens.size()) + 1 < s->request.max_new_tokens;
  }
  return someone_goes_on;
}

void Engine::accept_step(StepInFlight& step) {
  const at::Tensor& chosen = step.tokens.on_host();  // waits for this step only
  const int64_t* next = chosen.data_ptr<int64_t>();
  std::vector<std::unique_ptr<Sequence>> still;
  int64_t taken = 0;
  for (auto& s : running_) {
    const int64_t row = step.row_of(s->id);
    if (row < 0) {  // joined after the step was launched
      still.push_back(std::move(s));
      continue;
    }
    taken += 1;
    if (accept(*s, next[row], {})) {
      finish(*s);
    } else {
      still.push_back(std::move(s));
    }
  }
  running_ = std::move(still);
  stats_.decode_steps += 1;
  stats_.decode_tokens += taken;
}

void Engine::prefill(const std::vector<std::unique_ptr<Sequence>>& group) {
  const auto began = std::chrono::steady_clock::now();
  const int64_t b = static_cast<int64_t>(group.size());
  int64_t s = 0;
  for (const auto& sequence : group) {
    s = std::max<int64_t>(s, int64_t(sequence->request.prompt.size()));
    stats_.prefill_tokens += int64_t(sequence->request.prompt.size());
  }
  stats_.prefills += 1;
  std::vector<int64_t> slots, ids, kept;
  bool every_position = false;
  for (const auto& sequence : group) {
    const std::vector<int64_t>& prompt = sequence->request.prompt;
    slots.push_back(sequence->slot);
    kept.push_back(int64_t(prompt.size()));
    ids.insert(ids.end(), prompt.begin(), prompt.end());
    ids.insert(ids.end(), size_t(s) - prompt.size(), prompt.back());  // padding: any id, never kept
    every_position = every_position || sequence->request.prompt_logprobs;
  }
  KvCacheStep step(cache_, slots, s, weights_.device, kept);
  if (options_.cuda_graphs) step.allow_reading_in_place();
  const at::Tensor tokens = at::tensor(ids, at::kLong).view({b, s}).to(weights_.device);  // [b, s]
  // Every position's logits when a prompt's own log-probabilities are asked for, else each
  // prompt's last.
  const at::Tensor logits = logits_of(tokens, step, !every_position);  // [s or 1, b, V]
  step.commit();
  for (int64_t j = 0; j < b; ++j) {
    Sequence& sequence = *group[size_t(j)];
    const GenerationRequest& r = sequence.request;
    const int64_t length = int64_t(r.prompt.size());
    const at::Tensor mine = logits.select(1, j);  // [s or 1, V]
    if (r.prompt_logprobs) {
      const at::Tensor log_probs = mine.narrow(0, 0, length - 1).to(at::kCPU, at::kFloat).log_softmax(-1);  // [length - 1, V]
      for (int64_t i = 1; i < length; ++i) {
        sequence.result.prompt_logprobs.push_back(token_logprob(log_probs[i - 1], r.prompt[size_t(i)], std::max<int64_t>(r.logprobs, 0)));
      }
    }
    if (advance(sequence, mine[every_position ? length - 1 : 0])) finish(sequence);
  }
  stats_.prefill_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
}

at::Tensor Engine::whole_vocabulary(const at::Tensor& logits) const {
  // Every TP rank gathers the same whole rows, so each draws the same tokens from its own copy of
  // the sequence's generator: the ranks stay in step without sending tokens around.
  const dist::Group& tp = model_.tensor_parallel().group;
  return tp.size() > 1 ? tp::gather_from_tp(logits, tp) : logits;
}

at::Tensor Engine::logits_of(const at::Tensor& tokens, KvCacheStep& step, bool last_position_only) {
  const dist::Group& pp = options_.pipeline;
  if (pp.size() == 1) return whole_vocabulary(model_.forward_cached(tokens, step, last_position_only)).narrow(-1, 0, vocab_);
  // Every stage knows the step's shape (they run the same engine), so nothing but the tensors is sent.
  const int64_t s = step.new_tokens(), b = step.batch(), h = model_.config().hidden_size;
  const bool first = pp.rank() == 0, last = pp.rank() == pp.size() - 1;
  at::Tensor input;  // [s, b, h]
  if (!first) {
    input = at::empty({s, b, h}, at::TensorOptions().dtype(weights_.dtype).device(weights_.device));
    pp.recv(input, pp.rank() - 1);
  }
  const at::Tensor out = model_.forward_cached(tokens, step, last_position_only, input);
  if (!last) pp.send(out.contiguous(), pp.rank() + 1);
  // [s or 1, b, V]: the last stage's candidates, the same rows on every stage.
  at::Tensor logits = last ? whole_vocabulary(out).narrow(-1, 0, vocab_).contiguous()
                           : at::empty({last_position_only ? 1 : s, b, vocab_}, at::TensorOptions().dtype(weights_.dtype).device(weights_.device));
  pp.broadcast(logits, pp.size() - 1);
  return logits;
}

bool Engine::argmax_is_enough(const Sequence& s) {
  const SamplingOptions& o = s.request.sampling;
  return (o.greedy || o.temperature <= 0.0) && o.repetition_penalty == 1.0 && s.request.logprobs < 0;
}

bool Engine::advance(Sequence& s, const at::Tensor& logits) {
  return accept(s, sample_next_token(logits, s.request.sampling, s.generator, s.seen), logits);
}

bool Engine::accept(Sequence& s, int64_t next, const at::Tensor& logits) {
  if (s.request.logprobs >= 0) {
    s.result.logprobs.push_back(token_logprob(logits.to(at::kCPU, at::kFloat).log_softmax(-1), next, s.request.logprobs));
  }
  s.seen.push_back(next);
  s.result.tokens.push_back(next);
  if (s.request.on_token) s.request.on_token(next);
  const auto& stops = s.request.stop_ids;
  if (std::find(stops.begin(), stops.end(), next) != stops.end()) {
    // The stop id stays in `tokens` but not in the text (as vLLM and OpenAI leave EOS out).
    if (options_.detokenize) {
      s.result.text = options_.detokenize(std::vector<int64_t>(s.result.tokens.begin(), s.result.tokens.end() - 1));
      s.text_final = true;
    }
    s.result.finish_reason = "stop";
    return true;
  }
  if (!s.request.stop_strings.empty() && stop_string_in_tail(s)) {
    const std::string text = options_.detokenize(s.result.tokens);
    size_t first = std::string::npos;
    for (const std::string& stop : s.request.stop_strings) {
      if (!stop.empty()) first = std::min(first, text.find(stop));
    }
    if (first != std::string::npos) {
      s.result.text = text.substr(0, first);
      s.text_final = true;
      s.result.finish_reason = "stop";
      return true;
    }
  }
  if (static_cast<int64_t>(s.result.tokens.size()) >= s.request.max_new_tokens ||
      static_cast<int64_t>(s.seen.size()) >= cache_.capacity()) {
    s.result.finish_reason = "length";
    return true;
  }
  return false;
}

bool Engine::stop_string_in_tail(const Sequence& s) const {
  // A stop string that appears with this token ends within its bytes, so it lies within the last
  // (its length) bytes before them; every token is at least one byte, so that many tokens hold
  // them, and 8 more absorb what decoding a tail alone can change at its start (a character
  // split between tokens, SentencePiece's dropped leading space). The whole continuation is
  // decoded only when the tail holds a stop string: a step costs the same however long it gets.
  size_t longest = 0;
  for (const std::string& stop : s.request.stop_strings) longest = std::max(longest, stop.size());
  const size_t count = std::min(s.result.tokens.size(), longest + 8);
  const std::string tail = options_.detokenize(std::vector<int64_t>(s.result.tokens.end() - static_cast<std::ptrdiff_t>(count), s.result.tokens.end()));
  for (const std::string& stop : s.request.stop_strings) {
    if (!stop.empty() && tail.find(stop) != std::string::npos) return true;
  }
  return false;
}

void Engine::finish(Sequence& s) {
  if (options_.detokenize && !s.text_final) s.result.text = options_.detokenize(s.result.tokens);
  release_slot(s.slot);
  s.slot = -1;
  finished_[s.id] = std::move(s.result);
}

void Engine::release_slot(int64_t slot) {
  cache_.clear(slot);
  free_slots_.push_back(slot);
}

bool Engine::cancel(int64_t id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id == id) {
      waiting_.erase(it);
      return true;
    }
  }
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if ((*it)->id == id) {
      release_slot((*it)->slot);
      running_.erase(it);
      return true;
    }
  }
  if (chunked_ && chunked_->id == id) {
    release_slot(chunked_->slot);
    chunked_.reset();
    return true;
  }
  return false;
}

std::optional<GenerationResult> Engine::take_result(int64_t id) {
  auto it = finished_.find(id);
  if (it == finished_.end()) return std::nullopt;
  GenerationResult result = std::move(it->second);
  finished_.erase(it);
  return result;
}

double Engine::warm_up(const std::vector<int64_t>& prompt) {
  const auto began = std::chrono::steady_clock::now();
  const int64_t room = max_length() - int64_t(prompt.size());
  if (prompt.empty() || room < 1 || !idle()) return 0.0;
  GenerationRequest r;
  r.prompt = prompt;
  r.max_new_tokens = std::min<int64_t>(2, room);
  r.sampling.greedy = true;
  generate({std::move(r)});
  stats_ = EngineStats{};
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
}

std::vector<GenerationResult> Engine::generate(std::vector<GenerationRequest> requests) {
  std::vector<int64_t> ids;
  for (auto& r : requests) ids.push_back(submit(std::move(r)));
  while (!idle()) step();
  std::vector<GenerationResult> results;
  for (int64_t id : ids) results.push_back(*take_result(id));
  return results;
}

}  // namespace megatron
