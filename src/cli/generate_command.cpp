// `megatron generate (--load DIR | --load-hf DIR) --prompt TEXT [...]`: the model and tokenizer
// of a checkpoint (inference/generation_model.h) continue each prompt through the engine.
#include <ATen/ATen.h>

#include <cstdio>
#include <algorithm>
#include <map>

#include "cli/commands.h"
#include "core/errors.h"
#include "inference/engine.h"
#include "cli/inference_flags.h"
#include "tokenizer/tokenizer.h"

namespace megatron::cli {
namespace {

std::string help() {
  return std::string(
             "usage: megatron generate (--load DIR | --load-hf DIR) --prompt TEXT [--prompt TEXT ...] [flags]\n\n"
             "Continues each TEXT with the model of a checkpoint: the latest one under --load (as train\n"
             "--save wrote it, with the tokenizer it was trained with), or a Hugging Face model directory.\n"
             "Several prompts are generated together, as one batch over a key/value cache; one prompt\n"
             "streams its continuation.\n\n") +
         kInferenceModelFlagsHelp +
         "  --prompt TEXT                text to continue (repeat for a batch)\n"
         "  --max-new-tokens N           tokens to generate (default 64; --out-seq-length is an alias)\n"
         "  --greedy                     always take the most likely token\n"
         "  --temperature T              sampling temperature (default 1.0; 0 is greedy)\n"
         "  --top-k K                    sample among the K most likely tokens (default 0: all)\n"
         "  --top-p P                    sample among the most likely tokens holding probability P (default 1.0)\n"
         "  --min-p P                    drop tokens less likely than P x the most likely (default 0)\n"
         "  --repetition-penalty R       divide the logits of tokens already seen by R (HF's rule; default 1)\n"
         "  --stop TEXT                  stop when the continuation contains TEXT (repeatable; not printed)\n"
         "  --seed S                     sampling seed (default 1234; prompt i uses S + i)\n"
         "  --inference-max-batch-size N sequences decoded together (default 8)\n";
}

}  // namespace

int generate(const Args& args) {
  std::map<std::string, std::string> values;
  InferenceModelFlags model_flags;
  std::vector<std::string> prompts, stops;
  bool greedy = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(help().c_str(), stdout);
      return 0;
    }
    if (a == "--greedy") {
      greedy = true;
      continue;
    }
    if (take_inference_model_flag(args, i, model_flags)) continue;
    static const char* known[] = {"--prompt", "--max-new-tokens", "--out-seq-length", "--temperature", "--top-k", "--top-p",
                                  "--min-p", "--repetition-penalty", "--stop", "--seed", "--inference-max-batch-size"};
    if (std::find(std::begin(known), std::end(known), a) == std::end(known)) {
      throw UserError("unknown flag " + a + " for generate; see megatron generate --help");
    }
    if (i + 1 >= args.size()) throw UserError(a + ": expects a value");
    const std::string& value = args[++i];
    if (a == "--prompt") {
      prompts.push_back(value);
    } else if (a == "--stop") {
      if (value.empty()) throw UserError("--stop: expects a non-empty text");
      stops.push_back(value);
    } else {
      values[a == "--out-seq-length" ? "--max-new-tokens" : a] = value;
    }
  }
  if (prompts.empty()) throw UserError("generate needs --prompt TEXT");

  GenerationRequest request;
  SamplingOptions& o = request.sampling;
  o.greedy = greedy;
  if (values.count("--max-new-tokens")) request.max_new_tokens = static_cast<int64_t>(number_flag("--max-new-tokens", values["--max-new-tokens"]));
  if (values.count("--temperature")) o.temperature = number_flag("--temperature", values["--temperature"]);
  if (values.count("--top-k")) o.top_k = static_cast<int64_t>(number_flag("--top-k", values["--top-k"]));
  if (values.count("--top-p")) o.top_p = number_flag("--top-p", values["--top-p"]);
  if (values.count("--min-p")) o.min_p = number_flag("--min-p", values["--min-p"]);
  if (values.count("--repetition-penalty")) o.repetition_penalty = number_flag("--repetition-penalty", values["--repetition-penalty"]);
  if (values.count("--seed")) o.seed = static_cast<uint64_t>(number_flag("--seed", values["--seed"]));
  if (request.max_new_tokens < 1 || o.temperature < 0 || o.top_k < 0 || o.top_p <= 0 || o.top_p > 1 || o.min_p < 0 ||
      o.min_p > 1 || o.repetition_penalty <= 0) {
    throw UserError("generate: need --max-new-tokens >= 1, --temperature >= 0, --top-k >= 0, 0 < --top-p <= 1, "
                    "0 <= --min-p <= 1, --repetition-penalty > 0");
  }
  EngineOptions engine_options;
  if (values.count("--inference-max-batch-size")) {
    engine_options.max_batch = static_cast<int64_t>(number_flag("--inference-max-batch-size", values["--inference-max-batch-size"]));
    if (engine_options.max_batch < 1) throw UserError("--inference-max-batch-size must be at least 1");
  }
  const GenerationModel g = load_inference_model(model_flags);
  const Tokenizer& tokenizer = *g.tokenizer;
  engine_options.vocab_size = g.vocab_size;
  engine_options.detokenize = [&tokenizer](const std::vector<int64_t>& ids) { return tokenizer.decode(ids); };
  Engine engine(*g.model, engine_options);
  request.stop_ids = g.stop_ids;
  request.stop_strings = stops;

  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r = request;
    r.prompt = tokenizer.encode(prompts[i]);
    r.sampling.seed = o.seed + i;
    requests.push_back(std::move(r));
  }
  std::fprintf(stderr, "> %s: %zu prompt(s), sampling %s\n", g.source.c_str(), prompts.size(),
               o.greedy || o.temperature == 0 ? "greedily" : "with temperature / top-k / top-p / min-p");
  if (prompts.size() == 1 && stops.empty()) {
    // Stream: decode prompt + continuation each time and print what is new, so that tokenizers
    // that drop a leading space (SentencePiece) and characters split across tokens come out right.
    std::fputs(prompts[0].c_str(), stdout);
    std::vector<int64_t> all = requests[0].prompt;
    std::string printed = tokenizer.decode(all);
    requests[0].on_token = [&](int64_t id) {
      all.push_back(id);
      const std::string text = tokenizer.decode(all);
      if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
        std::fputs(text.c_str() + printed.size(), stdout);
        std::fflush(stdout);
        printed = text;
      }
    };
    engine.generate(std::move(requests));
    std::fputs("\n", stdout);
    return 0;
  }
  const std::vector<GenerationResult> results = engine.generate(std::move(requests));
  for (size_t i = 0; i < results.size(); ++i) {
    if (prompts.size() > 1) std::printf("--- %zu (%s)\n", i + 1, results[i].finish_reason.c_str());
    std::printf("%s%s\n", prompts[i].c_str(), results[i].text.c_str());
  }
  return 0;
}

}  // namespace megatron::cli
