// `megatron preprocess` as a library: JSONL (plain or gzip) -> Megatron indexed datasets, one per
// JSON key, named {prefix}_{key}_document.{bin,idx} and byte-identical to what Megatron-LM's
// tools/preprocess_data.py writes for the same token ids; and merge_datasets, Megatron's
// tools/merge_datasets.py. No LibTorch here.
//
// Pipeline: one reader thread cuts the input into batches of whole lines, N workers validate,
// parse and tokenize them, and the calling thread writes the results in input order. The number
// of batches between reader and writer is bounded, so memory does not grow with the corpus.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "data/indexed_dataset.h"
#include "tokenizer/tokenizer.h"

namespace megatron {

struct PreprocessOptions {
  std::string input;                            // .jsonl, or gzip-compressed (detected by content)
  std::vector<std::string> json_keys{"text"};   // one output dataset per key
  std::string output_prefix;
  bool append_eod = false;                      // EOD after each non-empty document, as Megatron
  // Megatron's --tokenizer-hf-include-special-tokens: let the tokenizer add BOS/EOS (its
  // post-processor / tokenizer_config.json). Megatron's current default (off) adds none.
  bool include_special_tokens = false;
  int workers = 1;                              // tokenizing threads
  int64_t log_interval = 1000;                  // progress line every this many documents
  bool skip_bad_lines = false;                  // false: the first bad line is an error
  std::FILE* progress = stderr;                 // nullptr: silent
};

struct BadLine {
  uint64_t line = 0;  // 1-based
  std::string reason;
};

struct PreprocessStats {
  uint64_t documents = 0;       // lines written as documents (to every key's dataset)
  uint64_t empty_lines = 0;     // blank lines, skipped
  uint64_t bad_lines = 0;       // skipped with --skip-bad-lines
  std::vector<BadLine> first_bad_lines;  // the first few of them, in input order
  uint64_t bytes_read = 0;      // uncompressed input bytes processed
  uint64_t tokens = 0;          // over all keys, EOD included
  double seconds = 0;
  std::vector<std::string> outputs;  // the prefixes written, one per key
};

// {prefix}_{key}_document: Megatron's output naming without --split-sentences.
std::string preprocess_output_prefix(const std::string& prefix, const std::string& key);

// The pipeline under preprocess_jsonl, for other line formats (SFT conversations): `encode` turns
// one non-blank line into per-output sequences exactly as encode_jsonl_line does (tokens[k] and
// sentences[k] for outputs[k]; "" or why the line is bad) and is called from several threads at
// once. Each line becomes one document in every output. Uses input, workers, log_interval,
// skip_bad_lines and progress from `options`; bad lines, blank lines, progress, errors and the
// all-or-nothing rename behave as in preprocess_jsonl.
using LineEncoder = std::function<std::string(std::string_view line, std::vector<std::vector<int64_t>>* tokens,
                                              std::vector<std::vector<int32_t>>* sentences)>;
struct LineOutput {
  std::string prefix;  // dataset path prefix (.bin/.idx)
  TokenDType dtype;
};
PreprocessStats preprocess_lines(const PreprocessOptions& options, const std::vector<LineOutput>& outputs,
                                 const LineEncoder& encode);

// Runs the whole conversion. Throws UserError for bad flags, unreadable input, or (without
// skip_bad_lines) the first bad line, as "<file>:<line>: <reason>". Output files appear under
// their final names only when every dataset is complete; on any error none are left behind.
PreprocessStats preprocess_jsonl(const PreprocessOptions& options, const Tokenizer& tokenizer);

// Megatron's merge_datasets: concatenates datasets in the order given. An input that is a
// directory stands for every dataset in it (prefixes with both .bin and .idx), sorted by name,
// as merge_datasets.py --input DIR does. Returns the prefixes merged.
std::vector<std::string> merge_datasets(const std::vector<std::string>& inputs,
                                        const std::string& output_prefix);

// One JSONL line -> per-key token sequences; exposed for tests and reuse (e.g. SFT).
// Returns "" on success or why the line is bad. `sentences[k]` receives the token counts of
// the non-empty sequences of key k (Megatron writes a key holding a list of strings as one
// sequence per string) and `tokens[k]` their tokens back to back; EOD is appended when asked.
std::string encode_jsonl_line(std::string_view line, const std::vector<std::string>& json_keys,
                              const Tokenizer& tokenizer, bool include_special_tokens,
                              bool append_eod, std::vector<std::vector<int64_t>>* tokens,
                              std::vector<std::vector<int32_t>>* sentences);

// The first checks of every JSONL line: strict UTF-8, valid JSON, an object. Returns "" and fills
// `doc`, or why the line is bad (the texts preprocess reports).
std::string parse_jsonl_object(std::string_view line, nlohmann::json* doc);
// "a string", "a list", "null", ... for messages about a value of the wrong type.
const char* json_type_name(const nlohmann::json& value);

}  // namespace megatron
