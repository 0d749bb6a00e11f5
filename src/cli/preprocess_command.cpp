// `megatron preprocess`: Megatron-LM's tools/preprocess_data.py (JSONL -> .bin/.idx) and, with
// --merge, tools/merge_datasets.py, under their flag names; with --sft, chat JSONL -> a packed SFT
// dataset. Parsing and reporting only; the work is in data/preprocess and data/sft_preprocess.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "core/errors.h"
#include "data/preprocess.h"
#include "data/sft_preprocess.h"

namespace megatron::cli {
namespace {

const char* const kHelp = R"(usage: megatron preprocess --input FILE.jsonl[.gz] --output-prefix P --tokenizer-type T [flags]
       megatron preprocess --sft --seq-length N --input CHAT.jsonl --output-prefix P --tokenizer-type T [flags]
       megatron preprocess --merge --input P1 [P2 ...] --output-prefix P

Tokenizes JSONL (one JSON object per line) into Megatron indexed datasets
P_{key}_document.bin/.idx, one per JSON key, byte-compatible with Megatron-LM's
tools/preprocess_data.py. Tokens are uint16 when the vocabulary has fewer than 65500 ids, else int32.

input / output:
  --input FILE              .jsonl, or gzip-compressed .jsonl (detected from the content)
  --json-keys K [K ...]     keys to extract, one dataset each (default: text). A value may be a
                            string (one sequence) or a list of strings (one sequence per string)
  --output-prefix P         output path prefix; missing directories are created
  --append-eod              append the end-of-document token (the tokenizer's EOS) to each document
tokenizer:
  --tokenizer-type T        HuggingFaceTokenizer, GPT2BPETokenizer, SentencePieceTokenizer,
                            GPTSentencePieceTokenizer, Llama2Tokenizer, TikTokenizer, NullTokenizer
  --tokenizer-model PATH    tokenizer.json (or its directory) / SentencePiece .model / TikTokenizer's
                            .json list of {rank, token_bytes, token_str}
  --vocab-file F, --merge-file F   GPT-2 vocab.json and merges.txt
  --vocab-size N            NullTokenizer vocabulary size; TikTokenizer's ids in all (default 131072)
  --tiktoken-pattern v1|v2  TikTokenizer's split pattern (default v2)
  --tiktoken-num-special-tokens N   TikTokenizer's special ids before the ranks (default 1000)
  --tokenizer-special-tokens T [T ...]   TikTokenizer's named special tokens (default <unk> <s> </s>
                            <mask> <pad> <cls> <sep>; EOD is </s>)
  --tokenizer-hf-include-special-tokens
                            let the tokenizer add its special tokens (e.g. Llama 3's BOS), as Megatron
                            does with this flag (and as Megatron releases before megatron.core.tokenizers
                            did by default for HuggingFaceTokenizer); off: no BOS/EOS are added
runtime:
  --workers N               tokenizing threads (default: the number of CPUs)
  --log-interval N          progress line every N documents (default 1000; 0: only at the end)
  --skip-bad-lines          skip lines that are not valid UTF-8 / JSON objects / lack a key or have a
                            non-string value, count them and list the first few; default: stop at
                            the first one with an error naming file:line
supervised fine-tuning (--sft): chat conversations -> a packed, pre-tokenized SFT dataset
  --sft                     each line is one conversation: {"messages": [{"role": "system|user|assistant",
                            "content": "..."}]} (OpenAI) or {"conversations": [{"from": "system|human|gpt",
                            "value": "..."}]} (ShareGPT). Lines without one, with another role, non-string
                            content, no messages or no assistant turn are bad lines (see --skip-bad-lines)
  --chat-template T         chatml, qwen3 (ChatML + Qwen3's <think> block), llama3, or auto (default:
                            llama3 / chatml from the tokenizer's special tokens)
  --seq-length N            training sequence length: conversations are packed, first-fit-decreasing,
                            into packs of at most N + 1 tokens, each kept whole
  --drop-long-samples       drop conversations longer than N + 1 tokens (default: keep their first
                            N + 1 tokens; either way they are counted and reported)
  Writes P_input_ids_document.bin/.idx (one document per pack, one sequence per conversation),
  P_loss_mask_document.bin/.idx (uint8, same layout: 1 on assistant content and its end-of-turn
  token) and P_sft.json (template, seq_length, counts); docs/formats.md has the details.
  --json-keys, --append-eod and --tokenizer-hf-include-special-tokens do not apply.
merge (Megatron's tools/merge_datasets.py):
  --merge                   concatenate the datasets given to --input (prefixes, or directories
                            holding .bin/.idx pairs, taken in name order) into --output-prefix

Blank lines are skipped and counted. Output files are written under temporary names and renamed
only when every dataset is complete: after an error nothing is left under the output names.
Not supported: --split-sentences / --keep-newlines (NLTK sentence splitting; pre-split the text
into a list of strings instead), --partitions (use --workers).
)";

std::vector<std::string> values_of(const Args& args, size_t* i, const std::string& flag, bool many) {
  std::vector<std::string> values;
  while (*i + 1 < args.size() && (values.empty() || many)) {
    const std::string& next = args[*i + 1];
    if (next.size() > 2 && next.rfind("--", 0) == 0) break;
    values.push_back(next);
    ++*i;
  }
  if (values.empty()) throw UserError(flag + " needs a value");
  return values;
}

int64_t integer_of(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0') throw UserError(flag + ": '" + value + "' is not an integer");
  return v;
}

void report_lines(const std::string& input, const PreprocessStats& stats) {
  if (stats.empty_lines > 0) {
    std::fprintf(stderr, "preprocess: skipped %llu blank lines\n",
                 static_cast<unsigned long long>(stats.empty_lines));
  }
  if (stats.bad_lines > 0) {
    std::fprintf(stderr, "preprocess: skipped %llu bad lines (--skip-bad-lines); the first %zu:\n",
                 static_cast<unsigned long long>(stats.bad_lines), stats.first_bad_lines.size());
    for (const BadLine& bad : stats.first_bad_lines) {
      std::fprintf(stderr, "  %s:%llu: %s\n", input.c_str(), static_cast<unsigned long long>(bad.line),
                   bad.reason.c_str());
    }
  }
}

int report_sft(const SftPreprocessOptions& opt, const SftPreprocessStats& s) {
  report_lines(opt.base.input, s.lines);
  const auto u = [](uint64_t v) { return static_cast<unsigned long long>(v); };
  const double capacity = static_cast<double>(s.packs) * static_cast<double>(opt.seq_length + 1);
  std::fprintf(stderr,
               "preprocess --sft: template %s | %llu conversations -> %llu packs of <= %lld tokens | "
               "%llu tokens, %llu trained | %.1f%% padding\n",
               s.chat_template.c_str(), u(s.samples), u(s.packs), static_cast<long long>(opt.seq_length + 1),
               u(s.tokens), u(s.trained_tokens),
               capacity > 0 ? 100.0 * (1.0 - static_cast<double>(s.tokens) / capacity) : 0.0);
  if (s.truncated + s.dropped_long + s.dropped_untrained > 0) {
    std::fprintf(stderr,
                 "preprocess --sft: longer than --seq-length + 1: %llu truncated, %llu dropped "
                 "(--drop-long-samples), %llu dropped (nothing left to train after truncation)\n",
                 u(s.truncated), u(s.dropped_long), u(s.dropped_untrained));
  }
  for (const std::string& out : s.outputs) std::fprintf(stderr, "preprocess: wrote %s.bin/.idx\n", out.c_str());
  std::fprintf(stderr, "preprocess: wrote %s\n", sft_metadata_path(opt.base.output_prefix).c_str());
  return 0;
}

}  // namespace

int preprocess(const Args& args) {
  PreprocessOptions opt;
  std::vector<std::string> inputs;
  TokenizerSpec spec;
  bool merge = false, workers_given = false, sft = false, json_keys_given = false;
  SftPreprocessOptions sft_opt;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    } else if (a == "--input") {
      inputs = values_of(args, &i, a, true);
    } else if (a == "--json-keys") {
      opt.json_keys = values_of(args, &i, a, true);
      json_keys_given = true;
    } else if (a == "--output-prefix") {
      opt.output_prefix = values_of(args, &i, a, false)[0];
    } else if (a == "--tokenizer-type") {
      spec.type = values_of(args, &i, a, false)[0];
    } else if (a == "--tokenizer-model") {
      spec.model = values_of(args, &i, a, false)[0];
    } else if (a == "--vocab-file") {
      spec.vocab_file = values_of(args, &i, a, false)[0];
    } else if (a == "--merge-file") {
      spec.merge_file = values_of(args, &i, a, false)[0];
    } else if (a == "--vocab-size") {
      spec.vocab_size = integer_of(a, values_of(args, &i, a, false)[0]);
    } else if (a == "--tiktoken-pattern") {
      spec.tiktoken_pattern = values_of(args, &i, a, false)[0];
    } else if (a == "--tiktoken-num-special-tokens") {
      spec.tiktoken_num_special_tokens = integer_of(a, values_of(args, &i, a, false)[0]);
    } else if (a == "--tokenizer-special-tokens") {
      spec.special_tokens = values_of(args, &i, a, true);
    } else if (a == "--append-eod") {
      opt.append_eod = true;
    } else if (a == "--tokenizer-hf-include-special-tokens") {
      opt.include_special_tokens = true;
    } else if (a == "--workers") {
      const int64_t n = integer_of(a, values_of(args, &i, a, false)[0]);
      if (n < 1 || n > 4096) throw UserError("--workers must be between 1 and 4096");
      opt.workers = static_cast<int>(n);
      workers_given = true;
    } else if (a == "--log-interval") {
      opt.log_interval = integer_of(a, values_of(args, &i, a, false)[0]);
      if (opt.log_interval < 0) throw UserError("--log-interval must be >= 0");
    } else if (a == "--skip-bad-lines") {
      opt.skip_bad_lines = true;
    } else if (a == "--merge") {
      merge = true;
    } else if (a == "--sft") {
      sft = true;
    } else if (a == "--chat-template") {
      sft_opt.chat_template = values_of(args, &i, a, false)[0];
    } else if (a == "--seq-length") {
      sft_opt.seq_length = integer_of(a, values_of(args, &i, a, false)[0]);
      if (sft_opt.seq_length < 1) throw UserError("--seq-length must be at least 1");
    } else if (a == "--drop-long-samples") {
      sft_opt.long_samples = SftLongSamples::kDrop;
    } else if (a == "--split-sentences" || a == "--keep-newlines" || a == "--lang") {
      throw UserError(a + " is not supported: megatron preprocess does no NLTK sentence splitting. "
                      "Split the text beforehand and give each document as a list of strings "
                      "(one sequence per string), or drop the flag for one sequence per document");
    } else if (a == "--partitions") {
      throw UserError("--partitions is not supported: one process reads the file and --workers threads "
                      "tokenize it; for several files run preprocess per file, then --merge");
    } else {
      throw UserError("unknown flag '" + a + "' (megatron preprocess --help lists the flags)");
    }
  }
  if (inputs.empty()) throw UserError("--input is required");
  if (opt.output_prefix.empty()) throw UserError("--output-prefix is required");

  if (merge && sft) throw UserError("--merge and --sft do not go together");
  if (merge) {
    const std::vector<std::string> merged = merge_datasets(inputs, opt.output_prefix);
    std::fprintf(stderr, "preprocess --merge: %zu datasets -> %s.bin/.idx\n", merged.size(),
                 opt.output_prefix.c_str());
    return 0;
  }
  if (inputs.size() != 1) {
    throw UserError("--input takes one file (got " + std::to_string(inputs.size()) +
                    "); preprocess each file separately, then combine them with --merge");
  }
  if (spec.type.empty()) throw UserError("--tokenizer-type is required");
  opt.input = inputs[0];
  if (!workers_given) opt.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  auto tokenizer = make_tokenizer(spec);
  if (sft) {
    if (json_keys_given || opt.append_eod || opt.include_special_tokens) {
      throw UserError("--sft: --json-keys, --append-eod and --tokenizer-hf-include-special-tokens do not apply "
                      "(the chat template decides every special token)");
    }
    sft_opt.base = opt;
    return report_sft(sft_opt, preprocess_sft(sft_opt, *tokenizer));
  }
  if (sft_opt.seq_length > 0 || sft_opt.chat_template != "auto" || sft_opt.long_samples != SftLongSamples::kTruncate) {
    throw UserError("--seq-length, --chat-template and --drop-long-samples need --sft");
  }
  const PreprocessStats stats = preprocess_jsonl(opt, *tokenizer);
  report_lines(opt.input, stats);
  for (const std::string& out : stats.outputs) std::fprintf(stderr, "preprocess: wrote %s.bin/.idx\n", out.c_str());
  return 0;
}

}  // namespace megatron::cli
