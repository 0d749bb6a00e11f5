// `megatron preprocess`: Megatron-LM's tools/preprocess_data.py (JSONL -> .bin/.idx) and, with
// --merge, tools/merge_datasets.py, under their flag names. Parsing and reporting only; the
// work is in data/preprocess.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "core/errors.h"
#include "data/preprocess.h"

namespace megatron::cli {
namespace {

const char* const kHelp = R"(usage: megatron preprocess --input FILE.jsonl[.gz] --output-prefix P --tokenizer-type T [flags]
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
                            GPTSentencePieceTokenizer, Llama2Tokenizer, NullTokenizer
  --tokenizer-model PATH    tokenizer.json (or its directory) / SentencePiece .model
  --vocab-file F, --merge-file F   GPT-2 vocab.json and merges.txt
  --vocab-size N            NullTokenizer vocabulary size
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

}  // namespace

int preprocess(const Args& args) {
  PreprocessOptions opt;
  std::vector<std::string> inputs;
  std::string tokenizer_type, tokenizer_model, vocab_file, merge_file;
  int64_t vocab_size = 0;
  bool merge = false, workers_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    } else if (a == "--input") {
      inputs = values_of(args, &i, a, true);
    } else if (a == "--json-keys") {
      opt.json_keys = values_of(args, &i, a, true);
    } else if (a == "--output-prefix") {
      opt.output_prefix = values_of(args, &i, a, false)[0];
    } else if (a == "--tokenizer-type") {
      tokenizer_type = values_of(args, &i, a, false)[0];
    } else if (a == "--tokenizer-model") {
      tokenizer_model = values_of(args, &i, a, false)[0];
    } else if (a == "--vocab-file") {
      vocab_file = values_of(args, &i, a, false)[0];
    } else if (a == "--merge-file") {
      merge_file = values_of(args, &i, a, false)[0];
    } else if (a == "--vocab-size") {
      vocab_size = integer_of(a, values_of(args, &i, a, false)[0]);
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
  if (tokenizer_type.empty()) throw UserError("--tokenizer-type is required");
  opt.input = inputs[0];
  if (!workers_given) opt.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  auto tokenizer = make_tokenizer(tokenizer_type, tokenizer_model, vocab_file, merge_file, vocab_size);
  const PreprocessStats stats = preprocess_jsonl(opt, *tokenizer);
  if (stats.empty_lines > 0) {
    std::fprintf(stderr, "preprocess: skipped %llu blank lines\n",
                 static_cast<unsigned long long>(stats.empty_lines));
  }
  if (stats.bad_lines > 0) {
    std::fprintf(stderr, "preprocess: skipped %llu bad lines (--skip-bad-lines); the first %zu:\n",
                 static_cast<unsigned long long>(stats.bad_lines), stats.first_bad_lines.size());
    for (const BadLine& bad : stats.first_bad_lines) {
      std::fprintf(stderr, "  %s:%llu: %s\n", opt.input.c_str(), static_cast<unsigned long long>(bad.line),
                   bad.reason.c_str());
    }
  }
  for (const std::string& out : stats.outputs) std::fprintf(stderr, "preprocess: wrote %s.bin/.idx\n", out.c_str());
  return 0;
}

}  // namespace megatron::cli
