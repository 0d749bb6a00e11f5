// `megatron eval --task FILE.jsonl ...`: benchmark scores of a checkpoint by lm-evaluation-
// harness's rules (eval/multiple_choice.h, eval/gsm8k.h) from local data, as `lm_eval --tasks`
// scores a model: a summary table on stdout in lm-eval's layout and, with --results-json, its
// results and per-document samples.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <system_error>

#include "cli/commands.h"
#include "cli/inference_flags.h"
#include "core/errors.h"
#include "core/files.h"
#include "distributed/world.h"
#include "eval/fewshot.h"
#include "eval/gsm8k.h"
#include "eval/multiple_choice.h"
#include "eval/task_data.h"
#include "inference/engine.h"
#include "inference/generation_model.h"
#include "tokenizer/tokenizer.h"

namespace megatron::cli {
namespace {

using json = nlohmann::json;

const char* kHelp =
    "usage: megatron eval --task FILE.jsonl [--task-format F] (--load DIR | --load-hf DIR) [flags]\n\n"
    "Scores a checkpoint on a benchmark's local JSONL by lm-evaluation-harness's rules: multiple\n"
    "choice by log-likelihood (acc, acc_norm), GSM8K by greedy generation and exact match\n"
    "(strict-match, flexible-extract). Prints lm-eval's summary table. (Without --task, eval\n"
    "reports validation and test loss with train's flags: megatron eval --help without --task.)\n\n"
    "  --task FILE                  the documents, one JSON record a line\n"
    "  --task-format F              multiple_choice ({question, choices, answer: index}; default),\n"
    "                               mmlu, arc, hellaswag, ceval (the datasets' own records, lm-eval's\n"
    "                               prompts), gsm8k ({question, answer})\n"
    "  --task-name NAME             its name in the table and JSON (default: the file's name)\n"
    "  --task-description TEXT      put before each document's few-shot examples (lm-eval's task\n"
    "                               description, e.g. C-Eval's subject line); multiple choice only\n"
    "  --num-fewshot N              examples before each document (default 0), drawn from:\n"
    "  --fewshot-file FILE          the few-shot split, same format (the task's own file: no document\n"
    "                               goes before itself)\n"
    "  --fewshot-sampler S          first_n (the split's first N) or default (lm-eval's seeded random\n"
    "                               draw, per document); default: as lm-eval's task of the format\n"
    "                               (first_n for mmlu and ceval, default for the others)\n"
    "  --fewshot-seed N             the default sampler's seed (lm-eval's fewshot_random_seed, 1234)\n"
    "  --limit N                    score the first N documents only; below 1, that fraction of\n"
    "                               them, rounded up (as lm-eval's --limit)\n"
    "  --max-new-tokens N           gsm8k: tokens generated at most (lm-eval's max_gen_toks, 256)\n"
    "  --inference-max-batch-size N sequences in flight (default 8)\n"
    "  --results-json PATH          write lm-eval's results layout and per-document samples\n";

std::string table_number(double v) {
  if (std::isnan(v)) return "   N/A";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.4f", v);
  return buffer;
}

void print_row(const std::string& task, int64_t shots, const std::string& filter, const std::string& metric, double value,
               double stderr_value) {
  std::printf("|%-16s|%6lld|%-16s|%-11s|%s|±  |%s|\n", task.c_str(), static_cast<long long>(shots), filter.c_str(),
              metric.c_str(), table_number(value).c_str(), table_number(stderr_value).c_str());
}

json number_or_na(double v) { return std::isnan(v) ? json("N/A") : json(v); }

}  // namespace

int eval_task(const Args& args) {
  InferenceModelFlags model_flags;
  std::string task, format_name = "multiple_choice", task_name, fewshot_file, sampler_name, results_json;
  std::optional<std::string> description;
  int64_t num_fewshot = 0, max_new_tokens = 256, max_batch = 8, fewshot_seed = 1234;
  double limit = 0;  // 0: every document
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kHelp, stdout);
      std::fputs(kInferenceModelFlagsHelp, stdout);
      return 0;
    }
    if (take_inference_model_flag(args, i, model_flags)) continue;
    static const char* known[] = {"--task", "--task-format", "--task-name", "--num-fewshot", "--fewshot-file", "--fewshot-sampler",
                                  "--fewshot-seed", "--task-description", "--limit", "--max-new-tokens", "--inference-max-batch-size", "--results-json"};
    if (std::find(std::begin(known), std::end(known), a) == std::end(known)) {
      throw UserError("unknown flag " + a + " for eval --task; see megatron eval --task FILE --help");
    }
    if (i + 1 >= args.size()) throw UserError(a + ": expects a value");
    const std::string& v = args[++i];
    auto count = [&](int64_t minimum) {
      const double n = number_flag(a, v);
      if (n != std::floor(n) || n < double(minimum)) throw UserError(a + ": expects a whole number >= " + std::to_string(minimum) + ", got " + v);
      return static_cast<int64_t>(n);
    };
    if (a == "--task") task = v;
    else if (a == "--task-format") format_name = v;
    else if (a == "--task-name") task_name = v;
    else if (a == "--fewshot-file") fewshot_file = v;
    else if (a == "--fewshot-sampler") sampler_name = v;
    else if (a == "--task-description") description = v;
    else if (a == "--fewshot-seed") fewshot_seed = count(0);
    else if (a == "--results-json") results_json = v;
    else if (a == "--num-fewshot") num_fewshot = count(0);
    else if (a == "--limit") {
      limit = number_flag(a, v);
      if (!(limit > 0) || (limit >= 1 && limit != std::floor(limit))) {
        throw UserError("--limit: expects a whole number of documents >= 1, or a fraction of them between 0 and 1, got " + v);
      }
    }
    else if (a == "--max-new-tokens") max_new_tokens = count(1);
    else max_batch = count(1);
  }
  const eval::TaskFormat format = eval::parse_task_format(format_name);
  if (task_name.empty()) task_name = std::filesystem::path(task).stem().string();
  if (num_fewshot > 0 && fewshot_file.empty()) {
    throw UserError("--num-fewshot " + std::to_string(num_fewshot) + " needs --fewshot-file FILE (the examples: a dev or train split)");
  }
  const bool generative = format == eval::TaskFormat::Gsm8k;
  if (description && generative) throw UserError("--task-description applies to the multiple-choice formats; gsm8k's prompt has none");

  const eval::FewshotSampler sampler = sampler_name.empty() ? eval::lm_eval_sampler(format) : eval::parse_fewshot_sampler(sampler_name);

  // The data first: a malformed file fails before the model loads.
  std::vector<eval::ChoiceDoc> choice_docs, choice_split;
  std::vector<eval::GenerationDoc> generation_docs, generation_split;
  // lm-eval's limit: a count from 1 up, a fraction of the documents (rounded up) below it.
  const int64_t whole_limit = limit >= 1 ? int64_t(limit) : 0;
  auto limited = [&](auto docs) {
    if (limit > 0 && limit < 1) docs.resize(size_t(std::ceil(double(docs.size()) * limit)));
    return docs;
  };
  if (generative) {
    generation_docs = limited(eval::read_generation_docs(task, whole_limit));
    if (num_fewshot > 0) generation_split = eval::read_generation_docs(fewshot_file);
  } else {
    choice_docs = limited(eval::read_choice_docs(task, format, whole_limit));
    if (description) {
      for (eval::ChoiceDoc& d : choice_docs) d.description = *description;  // in place of the format's own (MMLU's subject line)
    }
    if (num_fewshot > 0) choice_split = eval::read_choice_docs(fewshot_file, format);
  }
  const size_t examples = generative ? generation_split.size() : choice_split.size();
  if (int64_t(examples) < num_fewshot) {
    throw UserError("--fewshot-file " + fewshot_file + " holds " + std::to_string(examples) + " examples, fewer than --num-fewshot " +
                    std::to_string(num_fewshot));
  }
  // Each document's examples, drawn in the documents' order as lm-eval draws them.
  std::error_code same_error;
  const bool same_split = num_fewshot > 0 && std::filesystem::equivalent(fewshot_file, task, same_error);
  eval::FewshotDraw draw(sampler, examples, num_fewshot, fewshot_seed);
  std::vector<std::vector<eval::ChoiceDoc>> choice_shots;
  std::vector<std::vector<eval::GenerationDoc>> generation_shots;
  const size_t documents = generative ? generation_docs.size() : choice_docs.size();
  for (size_t d = 0; d < documents; ++d) {  // zero-shot: an empty list each
    std::function<bool(size_t)> is_doc;
    if (same_split && generative) {
      is_doc = [&](size_t i) { return generation_split[i].question == generation_docs[d].question && generation_split[i].answer == generation_docs[d].answer; };
    } else if (same_split) {
      is_doc = [&](size_t i) {
        const eval::ChoiceDoc &x = choice_split[i], &y = choice_docs[d];
        return x.text == y.text && x.choices == y.choices && x.gold == y.gold && x.description == y.description;
      };
    }
    const std::vector<size_t> picked = draw.next(is_doc);
    if (generative) {
      generation_shots.emplace_back();
      for (size_t i : picked) generation_shots.back().push_back(generation_split[i]);
    } else {
      choice_shots.emplace_back();
      for (size_t i : picked) choice_shots.back().push_back(choice_split[i]);
    }
  }

  const GenerationModel g = load_inference_model(model_flags, "eval");
  EngineOptions options = engine_options_for(model_flags, g);
  options.max_batch = max_batch;
  const Tokenizer& tokenizer = *g.tokenizer;
  Engine engine(*g.model, options);
  // Under tensor parallelism every rank scores the same documents alike; the first reports.
  const bool reports = g.parallel.rank == 0;
  if (reports) {
    const std::string how = num_fewshot == 0 ? "" : " (" + eval::fewshot_sampler_name(sampler) + " sampler" +
                                                     (sampler == eval::FewshotSampler::Default ? ", seed " + std::to_string(fewshot_seed) : "") + ")";
    std::fprintf(stderr, "> %s: %zu documents of %s (%s), %lld-shot%s, model %s%s\n", task_name.c_str(), documents, task.c_str(),
                 format_name.c_str(), static_cast<long long>(num_fewshot), how.c_str(), g.source.c_str(),
                 tensor_parallel_note(g, ", ").c_str());
    std::printf("|%-16s|%6s|%-16s|%-11s|%6s|   |%6s|\n", "Tasks", "n-shot", "Filter", "Metric", "Value", "Stderr");
    std::printf("|%s|%s|%s|%s|%s|---|%s|\n", std::string(16, '-').c_str(), std::string(6, '-').c_str(),
                std::string(16, '-').c_str(), std::string(11, '-').c_str(), std::string(6, '-').c_str(), std::string(6, '-').c_str());
  }

  json results = {{"alias", task_name}};
  json samples = json::array();
  // A row of the table and its two entries in the results ("acc,none", "acc_stderr,none"), as lm-eval names them.
  auto report = [&](const std::string& filter, const std::string& metric, double value, double stderr_value) {
    if (reports) print_row(task_name, num_fewshot, filter, metric, value, stderr_value);
    results[metric + "," + filter] = value;
    results[metric + "_stderr," + filter] = number_or_na(stderr_value);
  };
  if (generative) {
    const eval::GenerationTaskScore s = eval::score_gsm8k(engine, tokenizer, generation_docs, generation_shots, g.stop_ids, max_new_tokens);
    report("strict-match", "exact_match", s.strict, s.strict_stderr);
    report("flexible-extract", "exact_match", s.flexible, s.flexible_stderr);
    for (size_t i = 0; i < s.per_doc.size(); ++i) {
      const auto& d = s.per_doc[i];
      samples.push_back({{"doc_id", i}, {"prompt", eval::gsm8k_prompt(generation_docs[i], generation_shots[i])},
                         {"target", generation_docs[i].answer}, {"response", d.response},
                         {"strict-match", d.strict}, {"flexible-extract", d.flexible},
                         {"exact_match,strict-match", d.strict_correct ? 1.0 : 0.0},
                         {"exact_match,flexible-extract", d.flexible_correct ? 1.0 : 0.0}});
    }
  } else {
    const eval::ChoiceTaskScore s = eval::score_multiple_choice(engine, tokenizer, choice_docs, choice_shots);
    report("none", "acc", s.acc, s.acc_stderr);
    report("none", "acc_norm", s.acc_norm, s.acc_norm_stderr);
    if (s.truncated > 0 && reports) {
      std::fprintf(stderr, "> %lld (document, choice) requests were longer than the model's %lld tokens: their contexts lost their oldest tokens\n",
                   static_cast<long long>(s.truncated), static_cast<long long>(engine.max_length()));
    }
    for (size_t i = 0; i < s.per_doc.size(); ++i) {
      const auto& d = s.per_doc[i];
      json lls = json::array(), greedy = json::array();
      for (const auto& c : d.choices) lls.push_back(c.logprob), greedy.push_back(c.greedy);
      samples.push_back({{"doc_id", i}, {"context", eval::choice_context(choice_docs[i], choice_shots[i])},
                         {"choices", choice_docs[i].choices}, {"target", choice_docs[i].gold},
                         {"loglikelihoods", lls}, {"is_greedy", greedy},
                         {"acc", d.predicted == choice_docs[i].gold ? 1.0 : 0.0},
                         {"acc_norm", d.predicted_norm == choice_docs[i].gold ? 1.0 : 0.0}});
    }
  }
  if (g.world) g.world->shutdown();
  if (!results_json.empty() && reports) {
    const json out = {{"results", {{task_name, results}}},
                      {"n-shot", {{task_name, num_fewshot}}},
                      {"n-samples", {{task_name, {{"original", documents}, {"effective", documents}}}}},
                      {"config", {{"model", g.source}, {"task_file", task}, {"task_format", format_name}, {"fewshot_file", fewshot_file},
                                  {"fewshot_sampler", eval::fewshot_sampler_name(sampler)}, {"fewshot_seed", fewshot_seed}}},
                      {"samples", {{task_name, samples}}}};
    write_file_atomic(results_json, out.dump(2) + "\n");
    std::fprintf(stderr, "> results written to %s\n", results_json.c_str());
  }
  return 0;
}

}  // namespace megatron::cli
