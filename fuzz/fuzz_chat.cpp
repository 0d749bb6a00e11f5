// One line of a chat JSONL file as `megatron preprocess --sft` reads it (a conversation of
// system / user / assistant messages), validated, then rendered with every chat template over a
// small byte-level BPE tokenizer that has each template's special tokens. Invariants: one loss
// mask entry per id, every id inside the vocabulary, and the mask 0 or 1.
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>

#include "core/errors.h"
#include "data/chat_template.h"
#include "data/sft_preprocess.h"
#include "fuzz_target.h"
#include "tokenizer/hf_tokenizer.h"

namespace {

// 256 byte-level tokens (GPT-2's byte-to-unicode alphabet), then the special tokens.
std::string tokenizer_json() {
  std::string vocab;
  int id = 0, shifted = 0;
  for (int b = 0; b < 256; ++b) {
    // GPT-2's byte -> code point map: printable Latin-1 bytes stand for themselves, the rest map
    // to U+0100 onwards.
    const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
    const int code = printable ? b : 0x100 + shifted++;
    char escaped[16];
    std::snprintf(escaped, sizeof(escaped), "\\u%04x", code);
    vocab += std::string(id == 0 ? "" : ",") + "\"" + escaped + "\":" + std::to_string(id);
    ++id;
  }
  std::string added;
  for (const char* special : {"<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
                              "<|end_header_id|>", "<|eot_id|>", "<think>", "</think>"}) {
    added += std::string(added.empty() ? "" : ",") + "{\"id\":" + std::to_string(id++) + ",\"content\":\"" + special +
             "\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}";
  }
  return "{\"added_tokens\":[" + added +
         "],\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
         "\"use_regex\":true},\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
         "\"model\":{\"type\":\"BPE\",\"vocab\":{" + vocab + "},\"merges\":[]}}";
}

const megatron::Tokenizer& chat_tokenizer() {
  static const std::unique_ptr<megatron::tok::HfTokenizer> tokenizer = [] {
    const std::string path = megatron::fuzz::scratch_file("chat_tokenizer.json");
    std::ofstream(path, std::ios::binary | std::ios::trunc) << tokenizer_json();
    return megatron::tok::load_tokenizer_json(path);
  }();
  return *tokenizer;
}

}  // namespace

MEGATRON_FUZZ_TARGET(chat) {
  const megatron::Tokenizer& tokenizer = chat_tokenizer();
  static const std::vector<megatron::ChatTemplate> templates = [&] {
    std::vector<megatron::ChatTemplate> all;
    for (auto kind : {megatron::ChatTemplateKind::kChatML, megatron::ChatTemplateKind::kQwen3, megatron::ChatTemplateKind::kLlama3}) {
      all.emplace_back(kind, tokenizer);
    }
    return all;
  }();
  std::vector<megatron::ChatMessage> messages;
  std::string why = megatron::parse_sft_line(megatron::fuzz::as_text(data, size), &messages);
  if (why.empty()) why = megatron::validate_conversation(messages);
  if (!why.empty()) {
    megatron::fuzz::rejected(std::invalid_argument(why));
    return;
  }
  for (const megatron::ChatTemplate& chat : templates) {
    megatron::RenderedChat rendered;
    try {
      rendered = chat.render(messages);
    } catch (const megatron::UserError& e) {
      megatron::fuzz::rejected(e);
      continue;
    }
    if (rendered.ids.size() != rendered.loss_mask.size()) __builtin_trap();
    for (int64_t id : rendered.ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) __builtin_trap();
    }
    for (uint8_t m : rendered.loss_mask) {
      if (m > 1) __builtin_trap();
    }
  }
}
