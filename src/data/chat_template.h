// Chat templates for supervised fine-tuning: a conversation (system / user / assistant messages)
// -> token ids plus a per-token loss mask, with the ids transformers' apply_chat_template gives
// for the same conversation (tests/data/test_sft_data.cpp checks this against the real Qwen3 and
// Llama 3 tokenizers). No Jinja: the few templates SFT needs are written out in C++.
//
// Templates:
//   chatml  `<|im_start|>{role}\n{content}<|im_end|>\n` per message (Qwen2/2.5 without their
//           default system prompt, Yi, ...).
//   qwen3   chatml plus Qwen3's thinking rule, as its tokenizer_config.json template renders it:
//           an assistant turn after the last user message gets `<think>\n{reasoning}\n</think>\n\n`
//           before its content (empty reasoning for the last turn when it has none; reasoning comes
//           from "<think>...</think>" written in the content), and earlier turns lose their
//           reasoning.
//   llama3  BOS, then `<|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}<|eot_id|>` per
//           message (Meta's Llama 3 template; content is stripped of surrounding whitespace).
//   auto    llama3 when the tokenizer has <|start_header_id|> and <|eot_id|>, else chatml when it
//           has <|im_start|> and <|im_end|>. Never qwen3: Qwen3-2507 instruct models carry the same
//           tokens but not the thinking template, so that choice is left to the user.
//
// Loss mask: 1 exactly on the tokens the model produces at inference after the generation prompt
// (`<|im_start|>assistant\n` / `<|start_header_id|>assistant<|end_header_id|>\n\n`): the assistant
// content (with qwen3's think block) and the turn's end token (<|im_end|> / <|eot_id|>), which
// teaches the model to stop. Not the header, not the "\n" after <|im_end|> (generation has
// stopped by then), not system or user turns. This is what transformers'
// return_assistant_tokens_mask gives for templates that wrap "content + end token" in
// {% generation %} (TRL's training templates do), and what LLaMA-Factory / Pai-Megatron-Patch
// train on. Every assistant turn of a multi-turn conversation is trained.
//
// Special tokens of the template are inserted as their ids. Text around them is tokenized the way
// HF does it (the text between two special tokens as one piece, so "assistant\n" + content
// starting with "\n" tokenizes as "\n\n" in both); special-token strings written inside a content
// become their ids, as in apply_chat_template.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace megatron {

enum class ChatTemplateKind { kChatML, kQwen3, kLlama3 };

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

struct RenderedChat {
  std::vector<int64_t> ids;
  std::vector<uint8_t> loss_mask;  // same length as ids; 1 where the token is a training target
};

// "chatml", "qwen3", "llama3" or "auto" (resolved from the tokenizer's special tokens). Throws
// UserError naming --chat-template when the name is unknown or auto cannot tell.
ChatTemplateKind resolve_chat_template(const std::string& name, const Tokenizer& tokenizer);
const char* chat_template_name(ChatTemplateKind kind);

// "" when the conversation can be trained on, else why not: empty, a role other than
// system/user/assistant, or no assistant turn.
std::string validate_conversation(const std::vector<ChatMessage>& messages);

class ChatTemplate {
 public:
  // Looks up the template's special tokens; UserError when the tokenizer lacks one.
  ChatTemplate(ChatTemplateKind kind, const Tokenizer& tokenizer);

  ChatTemplateKind kind() const { return kind_; }
  // Renders a conversation that passed validate_conversation. Thread-safe (const, no caches
  // filled lazily). Throws UserError when the tokenizer rejects a text.
  RenderedChat render(const std::vector<ChatMessage>& messages) const;
  // The prompt a reply is generated from (serving): the conversation (any roles, the last turn
  // need not be the assistant's) and the assistant's header after it, as apply_chat_template
  // with add_generation_prompt=True renders it.
  std::vector<int64_t> generation_prompt(const std::vector<ChatMessage>& messages) const;

 private:
  void emit_special(int64_t id, bool trained, RenderedChat* out) const;
  void emit_text(const std::string& text, bool trained, RenderedChat* out) const;
  // head + body tokenized as one piece (as HF does); tokens past the ids `head` has on its own
  // are body tokens and get `trained`. A token straddling the two counts as body: it carries
  // body bytes.
  void emit_head_body(const std::string& head, const std::string& body, bool trained, RenderedChat* out) const;
  void render_chatml(const std::vector<ChatMessage>& messages, bool qwen3, RenderedChat* out) const;
  void render_llama3(const std::vector<ChatMessage>& messages, RenderedChat* out) const;

  ChatTemplateKind kind_;
  const Tokenizer& tokenizer_;
  int64_t begin_ = 0, end_ = 0;        // <|im_start|> <|im_end|> / <|start_header_id|> <|end_header_id|>
  int64_t eot_ = 0;                    // llama3's <|eot_id|>
  std::optional<int64_t> bos_;         // llama3
  std::vector<int64_t> newline_ids_;   // "\n" after <|im_end|>
  std::unordered_map<std::string, std::vector<int64_t>> head_ids_;  // filled in the constructor
};

}  // namespace megatron
