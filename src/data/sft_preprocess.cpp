// Chat JSONL parsing (OpenAI messages / ShareGPT conversations) and the two passes of
// preprocess_sft: render + tokenize through preprocess_lines into scratch datasets, then pack.
#include "data/sft_preprocess.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>

#include "core/errors.h"
#include "core/files.h"
#include "data/indexed_dataset.h"

namespace megatron {
namespace {

struct Format {
  const char* list_key;     // "messages" / "conversations"
  const char* role_key;     // "role" / "from"
  const char* content_key;  // "content" / "value"
};
constexpr Format kOpenAI{"messages", "role", "content"};
constexpr Format kShareGPT{"conversations", "from", "value"};

// ShareGPT speaker names -> roles ("" for an unknown one); OpenAI roles pass through
// (validate_conversation checks them).
std::string role_of(const Format& format, const std::string& speaker) {
  if (&format == &kOpenAI) return speaker;
  if (speaker == "human") return "user";
  if (speaker == "gpt") return "assistant";
  if (speaker == "system") return "system";
  return "";
}

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Removes the scratch datasets of pass 1 however preprocess_sft ends.
class ScratchFiles {
 public:
  explicit ScratchFiles(std::vector<std::string> prefixes) : prefixes_(std::move(prefixes)) {}
  ~ScratchFiles() {
    for (const std::string& p : prefixes_) {
      ::unlink((p + ".bin").c_str());
      ::unlink((p + ".idx").c_str());
    }
  }

 private:
  std::vector<std::string> prefixes_;
};

// True when tokens [1, n) of sample `seq` hold a loss-mask one: a truncated sample without one
// has nothing left to train on.
bool has_trained_token(const IndexedDataset& mask, size_t seq, int64_t n) {
  std::vector<int64_t> values(static_cast<size_t>(n));
  mask.read_tokens(seq, 0, values.size(), values.data());
  for (size_t i = 1; i < values.size(); ++i) {
    if (values[i] != 0) return true;
  }
  return false;
}

}  // namespace

std::string sft_input_ids_prefix(const std::string& prefix) { return preprocess_output_prefix(prefix, "input_ids"); }
std::string sft_loss_mask_prefix(const std::string& prefix) { return preprocess_output_prefix(prefix, "loss_mask"); }
std::string sft_metadata_path(const std::string& prefix) { return prefix + "_sft.json"; }

std::string parse_sft_line(std::string_view line, std::vector<ChatMessage>* messages) {
  messages->clear();
  nlohmann::json doc;
  if (std::string why = parse_jsonl_object(line, &doc); !why.empty()) return why;
  const Format* format = nullptr;
  if (doc.contains(kOpenAI.list_key)) {
    format = &kOpenAI;
  } else if (doc.contains(kShareGPT.list_key)) {
    format = &kShareGPT;
  } else {
    return "no \"messages\" (OpenAI style) or \"conversations\" (ShareGPT) key";
  }
  const nlohmann::json& list = doc[format->list_key];
  if (!list.is_array()) {
    return std::string("\"") + format->list_key + "\" is " + json_type_name(list) + ", expected a list";
  }
  if (format == &kShareGPT && doc.contains("system")) {
    const nlohmann::json& system = doc["system"];
    if (!system.is_string()) return std::string("\"system\" is ") + json_type_name(system) + ", expected a string";
    if (!system.get_ref<const std::string&>().empty()) messages->push_back({"system", system.get<std::string>()});
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& m = list[i];
    const std::string where = std::string(format->list_key) + "[" + std::to_string(i) + "]";
    if (!m.is_object()) return where + " is " + json_type_name(m) + ", expected an object";
    auto role = m.find(format->role_key);
    if (role == m.end() || !role->is_string()) {
      return where + ": \"" + format->role_key + "\" is " + (role == m.end() ? "missing" : json_type_name(*role)) +
             ", expected a string";
    }
    auto content = m.find(format->content_key);
    if (content == m.end() || !content->is_string()) {
      return where + ": \"" + format->content_key + "\" is " +
             (content == m.end() ? "missing" : json_type_name(*content)) + ", expected a string";
    }
    std::string mapped = role_of(*format, role->get_ref<const std::string&>());
    if (mapped.empty()) {
      return where + ": \"from\" is \"" + role->get<std::string>() + "\", expected human, gpt or system";
    }
    messages->push_back({std::move(mapped), content->get<std::string>()});
  }
  return validate_conversation(*messages);
}

SftPreprocessStats preprocess_sft(const SftPreprocessOptions& opt, const Tokenizer& tokenizer) {
  if (opt.seq_length < 1) throw UserError("--seq-length is required with --sft (the training sequence length)");
  if (opt.base.output_prefix.empty()) throw UserError("--output-prefix is required");
  const ChatTemplateKind kind = resolve_chat_template(opt.chat_template, tokenizer);
  const ChatTemplate chat(kind, tokenizer);
  const int64_t capacity = opt.seq_length + 1;

  SftPreprocessStats stats;
  stats.chat_template = chat_template_name(kind);
  const std::string scratch = opt.base.output_prefix + ".sft-scratch-" + std::to_string(::getpid());
  const std::string scratch_ids = sft_input_ids_prefix(scratch), scratch_mask = sft_loss_mask_prefix(scratch);
  ScratchFiles cleanup({scratch_ids, scratch_mask});
  const TokenDType dtype = token_dtype_for_vocab(tokenizer.vocab_size());

  // Pass 1: every conversation -> one sample (ids, mask) in the scratch datasets, in input order.
  stats.lines = preprocess_lines(opt.base, {{scratch_ids, dtype}, {scratch_mask, TokenDType::kUInt8}},
                                 [&](std::string_view line, std::vector<std::vector<int64_t>>* tokens,
                                     std::vector<std::vector<int32_t>>* sentences) -> std::string {
                                   std::vector<ChatMessage> messages;
                                   if (std::string why = parse_sft_line(line, &messages); !why.empty()) return why;
                                   RenderedChat r;
                                   try {
                                     r = chat.render(messages);
                                   } catch (const UserError& e) {
                                     return std::string("the tokenizer rejected the text: ") + e.what();
                                   }
                                   const int32_t n = static_cast<int32_t>(r.ids.size());
                                   *tokens = {std::move(r.ids), std::vector<int64_t>(r.loss_mask.begin(), r.loss_mask.end())};
                                   *sentences = {{n}, {n}};
                                   return "";
                                 });
  const IndexedDataset ids(scratch_ids), mask(scratch_mask);

  // Pass 2: fit, plan, copy.
  std::vector<uint32_t> kept;      // sample index per planned item
  std::vector<int64_t> lengths;    // its fitted length
  for (size_t i = 0; i < ids.num_sequences(); ++i) {
    const int64_t len = ids.sequence_length(i);
    const int64_t fitted = fitted_sample_length(len, capacity, opt.long_samples);
    if (fitted == 0) {
      ++stats.dropped_long;
      continue;
    }
    if (fitted < len) {
      if (!has_trained_token(mask, i, fitted)) {
        ++stats.dropped_untrained;
        continue;
      }
      ++stats.truncated;
    }
    kept.push_back(static_cast<uint32_t>(i));
    lengths.push_back(fitted);
  }
  const std::vector<std::vector<uint32_t>> bins = pack_first_fit_decreasing(lengths, capacity);

  stats.outputs = {sft_input_ids_prefix(opt.base.output_prefix), sft_loss_mask_prefix(opt.base.output_prefix)};
  IndexedDatasetBuilder ids_out(stats.outputs[0], dtype), mask_out(stats.outputs[1], TokenDType::kUInt8);
  std::vector<int64_t> buf_ids, buf_mask;
  for (const std::vector<uint32_t>& bin : bins) {
    for (uint32_t item : bin) {
      const size_t n = static_cast<size_t>(lengths[item]);
      buf_ids.resize(n);
      buf_mask.resize(n);
      ids.read_tokens(kept[item], 0, n, buf_ids.data());
      mask.read_tokens(kept[item], 0, n, buf_mask.data());
      ids_out.add_sequence(buf_ids.data(), n);
      mask_out.add_sequence(buf_mask.data(), n);
      stats.tokens += n;
      for (size_t t = 1; t < n; ++t) stats.trained_tokens += buf_mask[t] != 0;
    }
    ids_out.end_document();
    mask_out.end_document();
  }
  stats.samples = kept.size();
  stats.packs = bins.size();
  ids_out.finalize();
  mask_out.finalize();

  const nlohmann::json meta = {
      {"format", "megatron.cpp packed SFT"},
      {"version", 1},
      {"chat_template", stats.chat_template},
      {"seq_length", opt.seq_length},
      {"pack_capacity", capacity},
      {"packing", "first_fit_decreasing"},
      {"long_samples", opt.long_samples == SftLongSamples::kTruncate ? "truncate" : "drop"},
      {"input_ids", base_name(stats.outputs[0])},
      {"loss_mask", base_name(stats.outputs[1])},
      {"conversations", stats.lines.documents},
      {"bad_lines", stats.lines.bad_lines},
      {"samples", stats.samples},
      {"packs", stats.packs},
      {"truncated", stats.truncated},
      {"dropped_long", stats.dropped_long},
      {"dropped_untrained", stats.dropped_untrained},
      {"tokens", stats.tokens},
      {"trained_tokens", stats.trained_tokens},
  };
  write_file_atomic(sft_metadata_path(opt.base.output_prefix), meta.dump(2) + "\n");
  return stats;
}

}  // namespace megatron
