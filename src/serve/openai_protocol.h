// The OpenAI API's request and response bodies for /v1/completions and /v1/chat/completions, as
// the `openai` client and lm-evaluation-harness send and read them; no sockets here (server.h).
//
// Requests are checked field by field: an unknown field, a wrong type or a value out of range is
// an ApiError (HTTP 400) naming the field, as OpenAI's API answers. Sampling beyond OpenAI's
// fields takes vLLM's names (top_k, min_p, repetition_penalty), which the `openai` client passes
// through extra_body.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/chat_template.h"
#include "inference/engine.h"

namespace megatron::serve {

// An answer other than 200: the status and OpenAI's error object.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = "", std::string type = "invalid_request_error")
      : std::runtime_error(message), status(status), param(std::move(param)), type(std::move(type)) {}
  int status;
  std::string param;
  std::string type;
  nlohmann::json body() const;  // {"error": {"message", "type", "param", "code"}}
};

// A request made into what the engine runs: one GenerationRequest per choice (n) and per prompt
// (a completions request may carry several prompts: choices are prompt-major, as OpenAI's).
struct ParsedRequest {
  bool chat = false;
  bool stream = false;
  bool echo = false;            // completions: the prompt's text (and log-probabilities) first
  int64_t logprobs = -1;        // -1: none
  int64_t n = 1;                // choices per prompt
  std::string model;            // as the client named it ("" when it did not)
  std::vector<GenerationRequest> choices;
  std::vector<std::string> prompt_texts;  // per choice, the prompt as text (completions with echo only)
};

// What parsing needs to know of the model being served.
struct ServedModel {
  std::string name;           // --served-model-name
  const Tokenizer* tokenizer;
  const ChatTemplate* chat_template;  // null: /v1/chat/completions answers 400
  std::vector<int64_t> stop_ids;      // EOS
  int64_t max_length;                 // prompt + new tokens, at most
  int64_t vocab_size;
};

// body: the request's JSON text. Throws ApiError.
ParsedRequest parse_completion_request(const std::string& body, const ServedModel& model);
ParsedRequest parse_chat_request(const std::string& body, const ServedModel& model);

// The whole answer once every choice has finished.
nlohmann::json completion_response(const ParsedRequest& request, const std::vector<GenerationResult>& results,
                                   const ServedModel& model, const std::string& id, int64_t created);

// A streamed chunk of choice `index`: new text (and its tokens' log-probabilities), or, with
// finish_reason set, the choice's end. Chat streams begin each choice with a role-only delta
// (role_chunk).
nlohmann::json stream_chunk(const ParsedRequest& request, size_t index, const std::string& text, const std::string& finish_reason,
                            const std::string& model_name, const std::string& id, int64_t created);
nlohmann::json role_chunk(size_t index, const std::string& model_name, const std::string& id, int64_t created);

}  // namespace megatron::serve
