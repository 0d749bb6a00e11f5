#include "serve/openai_protocol.h"

#include <cmath>
#include <set>

#include "core/errors.h"
#include "core/json_text.h"

namespace megatron::serve {
namespace {

using json = nlohmann::json;

json parse_body(const std::string& body) {
  try {
    json j = parse_json_text(body, "the request body");
    if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
    return j;
  } catch (const UserError& e) {
    throw ApiError(400, e.what());
  }
}

// The fields a request may carry; any other is an error naming it (OpenAI answers the same).
void check_fields(const json& j, const std::set<std::string>& known) {
  for (const auto& [key, value] : j.items()) {
    if (!known.count(key)) throw ApiError(400, "unrecognized request argument supplied: " + key, key);
  }
}

double number_field(const json& j, const char* name, double fallback, double low, double high) {
  if (!j.contains(name) || j[name].is_null()) return fallback;
  if (!j[name].is_number()) throw ApiError(400, std::string(name) + " must be a number, got " + j[name].dump(), name);
  const double v = j[name].get<double>();
  if (!(v >= low && v <= high)) {
    throw ApiError(400, std::string(name) + " must be between " + json(low).dump() + " and " + json(high).dump() + ", got " + j[name].dump(), name);
  }
  return v;
}

int64_t integer_field(const json& j, const char* name, int64_t fallback, int64_t low, int64_t high) {
  if (!j.contains(name) || j[name].is_null()) return fallback;
  if (!j[name].is_number_integer()) throw ApiError(400, std::string(name) + " must be an integer, got " + j[name].dump(), name);
  const int64_t v = j[name].is_number_unsigned() && j[name].get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : j[name].get<int64_t>();
  if (v < low || v > high) {
    throw ApiError(400, std::string(name) + " must be between " + std::to_string(low) + " and " + std::to_string(high) + ", got " + j[name].dump(), name);
  }
  return v;
}

bool bool_field(const json& j, const char* name, bool fallback) {
  if (!j.contains(name) || j[name].is_null()) return fallback;
  if (!j[name].is_boolean()) throw ApiError(400, std::string(name) + " must be true or false, got " + j[name].dump(), name);
  return j[name].get<bool>();
}

std::vector<std::string> stop_field(const json& j) {
  std::vector<std::string> stops;
  if (!j.contains("stop") || j["stop"].is_null()) return stops;
  const json& s = j["stop"];
  for (const json& one : s.is_array() ? s : json::array({s})) {
    if (!one.is_string()) throw ApiError(400, "stop must be a string or a list of strings, got " + s.dump(), "stop");
    if (!one.get<std::string>().empty()) stops.push_back(one.get<std::string>());
  }
  if (stops.size() > 16) throw ApiError(400, "stop: at most 16 sequences, got " + std::to_string(stops.size()), "stop");
  return stops;
}

// The sampling fields shared by both endpoints, and the request's limits.
GenerationRequest common_request(const json& j, const ServedModel& model, ParsedRequest& out) {
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) throw ApiError(400, "model must be a string", "model");
    out.model = j["model"].get<std::string>();
    if (out.model != model.name) {
      throw ApiError(404, "the model `" + out.model + "` does not exist; this server serves `" + model.name + "`", "model", "NotFoundError");
    }
  }
  out.stream = bool_field(j, "stream", false);
  GenerationRequest r;
  SamplingOptions& o = r.sampling;
  o.temperature = number_field(j, "temperature", 1.0, 0.0, 2.0);
  o.greedy = o.temperature == 0.0;
  o.top_p = number_field(j, "top_p", 1.0, 0.0, 1.0);
  if (o.top_p == 0.0) throw ApiError(400, "top_p must be above 0", "top_p");
  o.top_k = integer_field(j, "top_k", 0, -1, model.vocab_size);
  if (o.top_k < 0) o.top_k = 0;  // vLLM's -1: no cut
  o.min_p = number_field(j, "min_p", 0.0, 0.0, 1.0);
  o.repetition_penalty = number_field(j, "repetition_penalty", 1.0, 1e-6, 100.0);
  o.seed = static_cast<uint64_t>(integer_field(j, "seed", 0, INT64_MIN, INT64_MAX));
  for (const char* unsupported : {"presence_penalty", "frequency_penalty"}) {
    if (number_field(j, unsupported, 0.0, -2.0, 2.0) != 0.0) {
      throw ApiError(400, std::string(unsupported) + " is not supported (use repetition_penalty)", unsupported);
    }
  }
  r.stop_strings = stop_field(j);
  r.stop_ids = model.stop_ids;
  return r;
}

// How many new tokens: the field, else what the model's length leaves (chat) or 16 (completions,
// OpenAI's default); prompt + new tokens within the model's length.
int64_t new_tokens(const json& j, const char* field, int64_t prompt, const ServedModel& model, bool chat) {
  const int64_t room = model.max_length - prompt;
  if (room < 1) {
    throw ApiError(400, "the prompt has " + std::to_string(prompt) + " tokens; this model's maximum length is " +
                            std::to_string(model.max_length) + " tokens, prompt and completion together", "messages");
  }
  const int64_t n = integer_field(j, field, chat ? room : std::min<int64_t>(16, room), 1, INT64_MAX);
  if (n > room) {
    throw ApiError(400, "the prompt's " + std::to_string(prompt) + " tokens and " + field + " " + std::to_string(n) +
                            " exceed this model's maximum length of " + std::to_string(model.max_length) + " tokens", field);
  }
  return n;
}

// A completions prompt: a text, a list of texts, a list of ids, or a list of id lists. With
// `texts` (echo) each prompt's text too: id lists decoded.
std::vector<std::vector<int64_t>> prompt_ids(const json& p, const ServedModel& model, std::vector<std::string>* texts) {
  auto ids_of = [&](const json& list) {
    std::vector<int64_t> ids;
    for (const json& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= model.vocab_size) {
        throw ApiError(400, "prompt: token id " + id.dump() + " is not one of this model's " + std::to_string(model.vocab_size), "prompt");
      }
      ids.push_back(id.get<int64_t>());
    }
    if (texts) texts->push_back(model.tokenizer->decode(ids));
    return ids;
  };
  auto text_of = [&](const json& text) {
    if (texts) texts->push_back(text.get<std::string>());
    return model.tokenizer->encode(text.get<std::string>());
  };
  std::vector<std::vector<int64_t>> out;
  if (p.is_string()) {
    out.push_back(text_of(p));
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    out.push_back(ids_of(p));
  } else if (p.is_array() && !p.empty()) {
    for (const json& one : p) {
      if (one.is_string()) out.push_back(text_of(one));
      else if (one.is_array()) out.push_back(ids_of(one));
      else throw ApiError(400, "prompt: each entry must be a text or a list of token ids", "prompt");
    }
  } else {
    throw ApiError(400, "prompt must be a text, a list of texts, a list of token ids or a list of such lists", "prompt");
  }
  for (const auto& ids : out) {
    if (ids.empty()) throw ApiError(400, "prompt: a prompt is empty (nothing to continue)", "prompt");
  }
  return out;
}

json logprob_entry(const Tokenizer& tok, int64_t id) {
  const auto piece = tok.id_to_token(id);
  return piece ? json(*piece) : json(tok.decode({id}));
}

// OpenAI's completions logprobs object over `ids` with their log-probabilities (null for a
// prompt's first token) and the top ids'.
json completion_logprobs(const Tokenizer& tok, const std::vector<int64_t>& ids, const std::vector<const TokenLogprob*>& lp) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  size_t offset = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    tokens.push_back(logprob_entry(tok, ids[i]));
    offsets.push_back(offset);
    offset += tok.decode({ids[i]}).size();
    if (lp[i] == nullptr) {
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(lp[i]->logprob);
    json t = json::object();
    for (const auto& [id, value] : lp[i]->top) t[logprob_entry(tok, id).get<std::string>()] = value;
    top.push_back(t);
  }
  return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

}  // namespace

json ApiError::body() const {
  return {{"error", {{"message", what()}, {"type", type}, {"param", param.empty() ? json(nullptr) : json(param)}, {"code", status}}}};
}

ParsedRequest parse_completion_request(const std::string& body, const ServedModel& model) {
  const json j = parse_body(body);
  check_fields(j, {"model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "logprobs", "echo", "stop", "seed",
                   "presence_penalty", "frequency_penalty", "user", "best_of", "top_k", "min_p", "repetition_penalty",
                   "stream_options"});
  ParsedRequest out;
  if (!j.contains("prompt")) throw ApiError(400, "prompt is required", "prompt");
  GenerationRequest base = common_request(j, model, out);
  out.echo = bool_field(j, "echo", false);
  out.logprobs = integer_field(j, "logprobs", -1, 0, 20);
  const int64_t n = out.n = integer_field(j, "n", 1, 1, 16);
  if (integer_field(j, "best_of", n, 1, 16) != n) throw ApiError(400, "best_of must equal n", "best_of");
  base.logprobs = out.logprobs;
  base.prompt_logprobs = out.echo && out.logprobs >= 0;
  std::vector<std::string> texts;
  const auto prompts = prompt_ids(j["prompt"], model, out.echo ? &texts : nullptr);
  for (size_t p = 0; p < prompts.size(); ++p) {
    const int64_t tokens = new_tokens(j, "max_tokens", int64_t(prompts[p].size()), model, false);
    for (int64_t c = 0; c < n; ++c) {
      GenerationRequest r = base;
      r.prompt = prompts[p];
      r.max_new_tokens = tokens;
      r.sampling.seed = base.sampling.seed + uint64_t(c);
      out.choices.push_back(r);
      if (out.echo) out.prompt_texts.push_back(texts[p]);
    }
  }
  return out;
}

ParsedRequest parse_chat_request(const std::string& body, const ServedModel& model) {
  const json j = parse_body(body);
  check_fields(j, {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream", "stop",
                   "seed", "presence_penalty", "frequency_penalty", "user", "logprobs", "top_logprobs", "top_k", "min_p",
                   "repetition_penalty", "stream_options"});
  if (model.chat_template == nullptr) {
    throw ApiError(400, "this model has no chat template (its tokenizer has neither <|im_start|> nor <|start_header_id|>); "
                        "use /v1/completions");
  }
  ParsedRequest out;
  out.chat = true;
  GenerationRequest base = common_request(j, model, out);
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty()) {
    throw ApiError(400, "messages must be a non-empty list of {role, content}", "messages");
  }
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < j["messages"].size(); ++i) {
    const json& m = j["messages"][i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) throw ApiError(400, where + ": needs a role", "messages");
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "developer") {
      throw ApiError(400, where + ": role \"" + role + "\" is not system, developer, user or assistant", "messages");
    }
    std::string content;
    const json& c = m.contains("content") ? m["content"] : json(nullptr);
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {  // [{type: "text", text}]: the texts joined
      for (const json& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
          throw ApiError(400, where + ": only text content parts are supported", "messages");
        }
        content += part["text"].get<std::string>();
      }
    } else {
      throw ApiError(400, where + ": content must be a text or a list of text parts", "messages");
    }
    messages.push_back({role == "developer" ? "system" : role, content});
  }
  const std::vector<int64_t> prompt = model.chat_template->generation_prompt(messages);
  const char* field = j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const int64_t tokens = new_tokens(j, field, int64_t(prompt.size()), model, true);
  if (bool_field(j, "logprobs", false)) out.logprobs = integer_field(j, "top_logprobs", 0, 0, 20);
  base.logprobs = out.logprobs;
  const int64_t n = out.n = integer_field(j, "n", 1, 1, 16);
  for (int64_t c = 0; c < n; ++c) {
    GenerationRequest r = base;
    r.prompt = prompt;
    r.max_new_tokens = tokens;
    r.sampling.seed = base.sampling.seed + uint64_t(c);
    out.choices.push_back(r);
  }
  return out;
}

json completion_response(const ParsedRequest& request, const std::vector<GenerationResult>& results, const ServedModel& model,
                         const std::string& id, int64_t created) {
  json choices = json::array();
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const GenerationResult& r = results[i];
    completion_tokens += int64_t(r.tokens.size());
    if (i % size_t(request.n) == 0) prompt_tokens += int64_t(request.choices[i].prompt.size());  // once per prompt, whatever n
    json choice = {{"index", i}, {"finish_reason", r.finish_reason}};
    json logprobs = nullptr;
    if (request.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", r.text}};
      if (request.logprobs >= 0) {
        json content = json::array();
        for (size_t t = 0; t < r.logprobs.size(); ++t) {
          json top = json::array();
          for (const auto& [tid, value] : r.logprobs[t].top) top.push_back({{"token", model.tokenizer->decode({tid})}, {"logprob", value}});
          content.push_back({{"token", model.tokenizer->decode({r.tokens[t]})}, {"logprob", r.logprobs[t].logprob}, {"top_logprobs", top}});
        }
        logprobs = {{"content", content}};
      }
    } else {
      choice["text"] = request.echo ? request.prompt_texts[i] + r.text : r.text;
      if (request.logprobs >= 0) {
        std::vector<int64_t> ids;
        std::vector<const TokenLogprob*> lp;
        if (request.echo) {
          ids = request.choices[i].prompt;
          lp.push_back(nullptr);  // the first prompt token has no log-probability
          for (const TokenLogprob& p : r.prompt_logprobs) lp.push_back(&p);
        }
        ids.insert(ids.end(), r.tokens.begin(), r.tokens.end());
        for (const TokenLogprob& p : r.logprobs) lp.push_back(&p);
        logprobs = completion_logprobs(*model.tokenizer, ids, lp);
      }
    }
    choice["logprobs"] = logprobs;
    choices.push_back(choice);
  }
  return {{"id", id},
          {"object", request.chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model.name},
          {"choices", choices},
          {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens}, {"total_tokens", prompt_tokens + completion_tokens}}}};
}

json role_chunk(size_t index, const std::string& model_name, const std::string& id, int64_t created) {
  return {{"id", id},
          {"object", "chat.completion.chunk"},
          {"created", created},
          {"model", model_name},
          {"choices", json::array({{{"index", index}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}})}};
}

json stream_chunk(const ParsedRequest& request, size_t index, const std::string& text, const std::string& finish_reason,
                  const std::string& model_name, const std::string& id, int64_t created) {
  json choice = {{"index", index}, {"logprobs", nullptr}, {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
  if (request.chat) {
    choice["delta"] = finish_reason.empty() ? json{{"content", text}} : json::object();
  } else {
    choice["text"] = text;
  }
  return {{"id", id},
          {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model_name},
          {"choices", json::array({choice})}};
}

}  // namespace megatron::serve
