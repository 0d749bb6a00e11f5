#include "inference/leading_engine.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include <cstring>

namespace megatron {
namespace {

using json = nlohmann::json;

// What a follower needs of a request (the leader keeps the streaming callback to itself).
json request_to_json(const GenerationRequest& r) {
  const SamplingOptions& o = r.sampling;
  return {{"prompt", r.prompt},
          {"max_new_tokens", r.max_new_tokens},
          {"sampling",
           {{"greedy", o.greedy}, {"temperature", o.temperature}, {"top_k", o.top_k}, {"top_p", o.top_p}, {"min_p", o.min_p},
            {"repetition_penalty", o.repetition_penalty}, {"seed", o.seed}}},
          {"stop_ids", r.stop_ids},
          {"stop_strings", r.stop_strings},
          {"logprobs", r.logprobs},
          {"prompt_logprobs", r.prompt_logprobs}};
}

GenerationRequest request_from_json(const json& j) {
  GenerationRequest r;
  r.prompt = j.at("prompt").get<std::vector<int64_t>>();
  r.max_new_tokens = j.at("max_new_tokens").get<int64_t>();
  const json& o = j.at("sampling");
  r.sampling.greedy = o.at("greedy").get<bool>();
  r.sampling.temperature = o.at("temperature").get<double>();
  r.sampling.top_k = o.at("top_k").get<int64_t>();
  r.sampling.top_p = o.at("top_p").get<double>();
  r.sampling.min_p = o.at("min_p").get<double>();
  r.sampling.repetition_penalty = o.at("repetition_penalty").get<double>();
  r.sampling.seed = o.at("seed").get<uint64_t>();
  r.stop_ids = j.at("stop_ids").get<std::vector<int64_t>>();
  r.stop_strings = j.at("stop_strings").get<std::vector<std::string>>();
  r.logprobs = j.at("logprobs").get<int64_t>();
  r.prompt_logprobs = j.at("prompt_logprobs").get<bool>();
  return r;
}

// A message from the first rank of `group` to the others: its length, then its bytes.
std::string broadcast_text(const dist::Group& group, const c10::Device& device, const std::string& text) {
  const at::TensorOptions on = at::TensorOptions().device(device);
  at::Tensor length = at::full({1}, static_cast<int64_t>(text.size()), on.dtype(at::kLong));
  group.broadcast(length, 0);
  const int64_t n = length.item<int64_t>();
  at::Tensor bytes = at::empty({n}, at::TensorOptions().dtype(at::kByte));
  if (group.rank() == 0) std::memcpy(bytes.data_ptr(), text.data(), static_cast<size_t>(n));
  at::Tensor on_device = bytes.to(device);
  group.broadcast(on_device, 0);
  bytes = on_device.to(at::kCPU);
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(n));
}

}  // namespace

LeadingEngine::LeadingEngine(Engine& engine, dist::Group group, const c10::Device& device)
    : engine_(engine), group_(std::move(group)), device_(device) {}

int64_t LeadingEngine::submit(GenerationRequest request) {
  const std::string recorded = group_.size() > 1 ? json{{"submit", request_to_json(request)}}.dump() : "";
  const int64_t id = engine_.submit(std::move(request));  // a refused request is not recorded
  if (group_.size() > 1) record_.push_back(recorded);
  return id;
}

bool LeadingEngine::cancel(int64_t id) {
  if (group_.size() > 1) record_.push_back(json{{"cancel", id}}.dump());
  return engine_.cancel(id);
}

void LeadingEngine::step() {
  send(/*step=*/true, /*stop=*/false);
  engine_.step();
}

void LeadingEngine::keep_alive() { send(false, false); }

void LeadingEngine::finish() {
  if (finished_) return;
  send(false, true);
  finished_ = true;
}

void LeadingEngine::send(bool step, bool stop) {
  if (group_.size() == 1) return;
  // The recorded calls are JSON already: joined into the message as they are.
  std::string calls;
  for (const std::string& call : record_) calls += (calls.empty() ? "" : ",") + call;
  record_.clear();
  broadcast_text(group_, device_, "{\"calls\":[" + calls + "],\"step\":" + (step ? "true" : "false") + ",\"stop\":" + (stop ? "true" : "false") + "}");
}

void follow_leading_engine(Engine& engine, const dist::Group& group, const c10::Device& device) {
  for (;;) {
    const json message = json::parse(broadcast_text(group, device, ""));
    for (const json& call : message.at("calls")) {
      // The leader's engine took these calls, so this one takes them alike (same model, same state).
      if (call.contains("submit")) engine.submit(request_from_json(call["submit"]));
      if (call.contains("cancel")) engine.cancel(call["cancel"].get<int64_t>());
    }
    if (message.at("stop").get<bool>()) return;
    if (message.at("step").get<bool>()) engine.step();
    engine.discard_results();  // the leader answers the clients; nothing here reads them
  }
}

}  // namespace megatron
