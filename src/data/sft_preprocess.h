// `megatron preprocess --sft` as a library: chat JSONL -> a packed, pre-tokenized SFT dataset.
//
// Input lines (one conversation each):
//   OpenAI style  {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
//   ShareGPT      {"conversations": [{"from": "system"|"human"|"gpt", "value": "..."}, ...]}
//                 (an optional top-level "system" string becomes the first message)
// A line without either key, with another role, a non-string content, an empty conversation or
// no assistant turn is a bad line: an error naming file:line, or skipped and counted with
// --skip-bad-lines (preprocess's own machinery, shared through preprocess_lines).
//
// Output under prefix P (docs/formats.md):
//   P_input_ids_document.{bin,idx}  token ids; one document per pack, one sequence per sample
//   P_loss_mask_document.{bin,idx}  uint8, same sequence lengths and documents: 1 where the token
//                                   is a training target (chat_template.h says which)
//   P_sft.json                      what was done: template, seq_length, counts (metadata only)
// Pass 1 streams the conversations through preprocess_lines into scratch datasets next to the
// output (P.sft-scratch-<pid>_*, removed afterwards), so memory holds only the sample lengths;
// pass 2 plans the packs (sft_packing.h) and copies the samples into them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/chat_template.h"
#include "data/preprocess.h"
#include "data/sft_packing.h"

namespace megatron {

struct SftPreprocessOptions {
  PreprocessOptions base;                 // input, output_prefix, workers, log_interval, skip_bad_lines, progress
  std::string chat_template = "auto";     // chatml | qwen3 | llama3 | auto
  int64_t seq_length = 0;                 // --seq-length of training; packs hold seq_length + 1 tokens
  SftLongSamples long_samples = SftLongSamples::kTruncate;
};

struct SftPreprocessStats {
  PreprocessStats lines;                  // conversations read, blank and bad lines, bytes
  std::string chat_template;              // the template used (auto resolved)
  uint64_t samples = 0;                   // conversations packed
  uint64_t packs = 0;
  uint64_t truncated = 0;                 // longer than seq_length + 1, cut to it
  uint64_t dropped_long = 0;              // longer than seq_length + 1, dropped (--drop-long-samples)
  uint64_t dropped_untrained = 0;         // truncation left no trained token: dropped
  uint64_t tokens = 0;                    // in the packs
  uint64_t trained_tokens = 0;            // loss-mask ones in the packs
  std::vector<std::string> outputs;       // the two dataset prefixes
};

// Names of the outputs under prefix P.
std::string sft_input_ids_prefix(const std::string& prefix);   // P_input_ids_document
std::string sft_loss_mask_prefix(const std::string& prefix);   // P_loss_mask_document
std::string sft_metadata_path(const std::string& prefix);      // P_sft.json

// One JSONL line -> its messages, or "" replaced by why the line is bad. Roles are mapped to
// system/user/assistant (ShareGPT's human -> user, gpt -> assistant) and validated.
std::string parse_sft_line(std::string_view line, std::vector<ChatMessage>* messages);

// The whole conversion. Throws UserError for bad flags, unreadable input or (without
// skip_bad_lines) the first bad line as "<file>:<line>: <reason>"; on any error no output is
// left under the final names.
SftPreprocessStats preprocess_sft(const SftPreprocessOptions& options, const Tokenizer& tokenizer);

}  // namespace megatron
