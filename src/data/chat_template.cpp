// Rendering of the chatml / qwen3 / llama3 templates into ids and loss masks (see chat_template.h
// for the templates and the loss-mask rule).
#include "data/chat_template.h"

#include <algorithm>

#include "core/errors.h"

namespace megatron {
namespace {

// Python's str.isspace() code points: what Jinja's `trim` (Python str.strip()) removes.
bool is_python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Decodes the code point starting at s[i] (valid UTF-8: preprocess checked the line); sets *len.
uint32_t decode_at(const std::string& s, size_t i, size_t* len) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k])); };
  const uint32_t c = b(0);
  if (c < 0x80 || i + 1 >= s.size()) { *len = 1; return c; }
  if (c < 0xE0) { *len = 2; return ((c & 0x1F) << 6) | (b(1) & 0x3F); }
  if (c < 0xF0 && i + 2 < s.size()) { *len = 3; return ((c & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F); }
  if (i + 3 < s.size()) {
    *len = 4;
    return ((c & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
  *len = 1;
  return c;
}

std::string python_strip(const std::string& s) {
  size_t begin = 0, len = 0;
  while (begin < s.size() && is_python_space(decode_at(s, begin, &len))) begin += len;
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;  // back up to the lead byte of the last code point
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    if (!is_python_space(decode_at(s, start, &len))) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

std::string lstrip_newlines(const std::string& s) {
  const size_t i = s.find_first_not_of('\n');
  return i == std::string::npos ? "" : s.substr(i);
}
std::string rstrip_newlines(const std::string& s) {
  const size_t i = s.find_last_not_of('\n');
  return i == std::string::npos ? "" : s.substr(0, i + 1);
}
bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

int64_t require_token(const Tokenizer& tok, const char* token, ChatTemplateKind kind) {
  std::optional<int64_t> id = tok.token_to_id(token);
  if (!id) {
    throw UserError(std::string("--chat-template ") + chat_template_name(kind) + ": the tokenizer has no " + token +
                    " token; pick the template of this model's family (chatml, qwen3, llama3) or auto");
  }
  return *id;
}

}  // namespace

const char* chat_template_name(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kChatML: return "chatml";
    case ChatTemplateKind::kQwen3: return "qwen3";
    case ChatTemplateKind::kLlama3: return "llama3";
  }
  return "?";
}

ChatTemplateKind resolve_chat_template(const std::string& name, const Tokenizer& tok) {
  if (name == "chatml") return ChatTemplateKind::kChatML;
  if (name == "qwen3") return ChatTemplateKind::kQwen3;
  if (name == "llama3") return ChatTemplateKind::kLlama3;
  if (name != "auto") throw UserError("--chat-template: unknown template '" + name + "' (chatml, qwen3, llama3, auto)");
  if (tok.token_to_id("<|start_header_id|>") && tok.token_to_id("<|eot_id|>")) return ChatTemplateKind::kLlama3;
  if (tok.token_to_id("<|im_start|>") && tok.token_to_id("<|im_end|>")) return ChatTemplateKind::kChatML;
  throw UserError("--chat-template auto: the tokenizer has neither Llama 3's <|start_header_id|>/<|eot_id|> nor "
                  "ChatML's <|im_start|>/<|im_end|>; name the template with --chat-template chatml|qwen3|llama3");
}

std::string validate_conversation(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) return "empty conversation";
  bool assistant = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return "message " + std::to_string(i) + ": role \"" + role + "\" is not system, user or assistant";
    }
    assistant = assistant || role == "assistant";
  }
  if (!assistant) return "no assistant turn: nothing to train on";
  return "";
}

ChatTemplate::ChatTemplate(ChatTemplateKind kind, const Tokenizer& tok) : kind_(kind), tokenizer_(tok) {
  if (kind == ChatTemplateKind::kLlama3) {
    begin_ = require_token(tok, "<|start_header_id|>", kind);
    end_ = require_token(tok, "<|end_header_id|>", kind);
    eot_ = require_token(tok, "<|eot_id|>", kind);
    bos_ = tok.bos_id() ? tok.bos_id() : tok.token_to_id("<|begin_of_text|>");
    if (!bos_) throw UserError("--chat-template llama3: the tokenizer has no BOS (<|begin_of_text|>) token");
    head_ids_["\n\n"] = tok.encode("\n\n", false);
  } else {
    begin_ = require_token(tok, "<|im_start|>", kind);
    end_ = require_token(tok, "<|im_end|>", kind);
    newline_ids_ = tok.encode("\n", false);
    for (const char* role : {"system", "user", "assistant"}) {
      head_ids_[std::string(role) + "\n"] = tok.encode(std::string(role) + "\n", false);
    }
  }
}

void ChatTemplate::emit_special(int64_t id, bool trained, RenderedChat* out) const {
  out->ids.push_back(id);
  out->loss_mask.push_back(trained ? 1 : 0);
}

void ChatTemplate::emit_text(const std::string& text, bool trained, RenderedChat* out) const {
  const std::vector<int64_t> ids = tokenizer_.encode(text, false);
  out->ids.insert(out->ids.end(), ids.begin(), ids.end());
  out->loss_mask.insert(out->loss_mask.end(), ids.size(), trained ? 1 : 0);
}

void ChatTemplate::emit_head_body(const std::string& head, const std::string& body, bool trained,
                                  RenderedChat* out) const {
  const std::vector<int64_t> ids = tokenizer_.encode(head + body, false);
  auto it = head_ids_.find(head);
  const std::vector<int64_t> head_alone = it != head_ids_.end() ? it->second : tokenizer_.encode(head, false);
  size_t n_head = 0;
  while (n_head < head_alone.size() && n_head < ids.size() && ids[n_head] == head_alone[n_head]) ++n_head;
  out->ids.insert(out->ids.end(), ids.begin(), ids.end());
  out->loss_mask.insert(out->loss_mask.end(), n_head, 0);
  out->loss_mask.insert(out->loss_mask.end(), ids.size() - n_head, trained ? 1 : 0);
}

RenderedChat ChatTemplate::render(const std::vector<ChatMessage>& messages) const {
  RenderedChat out;
  if (kind_ == ChatTemplateKind::kLlama3) {
    render_llama3(messages, &out);
  } else {
    render_chatml(messages, kind_ == ChatTemplateKind::kQwen3, &out);
  }
  return out;
}

std::vector<int64_t> ChatTemplate::generation_prompt(const std::vector<ChatMessage>& messages) const {
  RenderedChat out = messages.empty() ? RenderedChat{} : render(messages);
  if (kind_ == ChatTemplateKind::kLlama3) {
    if (messages.empty()) emit_special(*bos_, false, &out);
    emit_special(begin_, false, &out);
    emit_text("assistant", false, &out);
    emit_special(end_, false, &out);
    emit_text("\n\n", false, &out);
  } else {
    emit_special(begin_, false, &out);
    emit_text("assistant\n", false, &out);
  }
  return out.ids;
}

void ChatTemplate::render_chatml(const std::vector<ChatMessage>& messages, bool qwen3, RenderedChat* out) const {
  // Qwen3's template: the last user message that is not a tool response ends the "query"; only
  // assistant turns after it keep (or, when last, get an empty) think block.
  const size_t n = messages.size();
  size_t last_query = n - 1;
  for (size_t i = n; i-- > 0;) {
    const std::string& c = messages[i].content;
    if (messages[i].role == "user" && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    const bool assistant = m.role == "assistant";
    std::string body = m.content;
    if (qwen3 && assistant) {
      std::string reasoning;
      const size_t close = body.find("</think>");
      if (close != std::string::npos) {
        const std::string before = rstrip_newlines(body.substr(0, close));
        const size_t open = before.rfind("<think>");
        reasoning = lstrip_newlines(open == std::string::npos ? before : before.substr(open + 7));
        body = lstrip_newlines(body.substr(body.rfind("</think>") + 8));
      }
      if (i > last_query && (i == n - 1 || !reasoning.empty())) {
        body = "<think>\n" + lstrip_newlines(rstrip_newlines(reasoning)) + "\n</think>\n\n" + lstrip_newlines(body);
      }
    }
    emit_special(begin_, false, out);
    emit_head_body(m.role + "\n", body, assistant, out);
    emit_special(end_, assistant, out);
    out->ids.insert(out->ids.end(), newline_ids_.begin(), newline_ids_.end());
    out->loss_mask.insert(out->loss_mask.end(), newline_ids_.size(), 0);
  }
}

void ChatTemplate::render_llama3(const std::vector<ChatMessage>& messages, RenderedChat* out) const {
  emit_special(*bos_, false, out);
  for (const ChatMessage& m : messages) {
    const bool assistant = m.role == "assistant";
    emit_special(begin_, false, out);
    emit_text(m.role, false, out);
    emit_special(end_, false, out);
    emit_head_body("\n\n", python_strip(m.content), assistant, out);
    emit_special(eot_, assistant, out);
  }
}

}  // namespace megatron
