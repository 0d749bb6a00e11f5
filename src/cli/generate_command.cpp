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
#include "core/config.h"
#include "model/gpt_model.h"
#include "tokenizer/tokenizer.h"
#include "distributed/world.h"
#include "train/profiler.h"

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
         "  --inference-max-batch-size N sequences decoded together (default 8)\n"
         "  --ignore-eos                 generate --max-new-tokens tokens whatever comes (benchmarks)\n"
         "  --profile                    profile engine steps 10 and 11 (the PyTorch profiler: a table of where\n"
         "                               the time went, a Chrome trace in --tensorboard-dir, default the working directory)\n"
         "  --tensorboard-dir DIR        where --profile writes its trace\n";
}

// The decode graphs' captures, a one-off cost each (the first step of a batch size and key
// bound), which the step time leaves out.
std::string captures_note(const EngineStats& t) {
  if (t.graph_captures == 0) return "";
  char note[96];
  std::snprintf(note, sizeof(note), "; %lld graph%s captured in %.1f ms, not in the step time", static_cast<long long>(t.graph_captures),
                t.graph_captures == 1 ? "" : "s", 1e3 * t.capture_seconds);
  return note;
}

}  // namespace

int generate(const Args& args) {
  std::map<std::string, std::string> values;
  InferenceModelFlags model_flags;
  std::vector<std::string> prompts, stops;
  bool greedy = false, ignore_eos = false, profile = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(help().c_str(), stdout);
      return 0;
    }
    if (a == "--greedy" || a == "--ignore-eos" || a == "--profile") {
      (a == "--greedy" ? greedy : a == "--profile" ? profile : ignore_eos) = true;
      continue;
    }
    if (take_inference_model_flag(args, i, model_flags)) continue;
    static const char* known[] = {"--prompt", "--max-new-tokens", "--out-seq-length", "--temperature", "--top-k", "--top-p",
                                  "--min-p", "--repetition-penalty", "--stop", "--seed", "--inference-max-batch-size",
                                  "--tensorboard-dir"};
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
  int64_t max_batch = EngineOptions().max_batch;
  if (values.count("--inference-max-batch-size")) {
    max_batch = static_cast<int64_t>(number_flag("--inference-max-batch-size", values["--inference-max-batch-size"]));
    if (max_batch < 1) throw UserError("--inference-max-batch-size must be at least 1");
  }
  const GenerationModel g = load_inference_model(model_flags, "generate");
  const Tokenizer& tokenizer = *g.tokenizer;
  EngineOptions engine_options = engine_options_for(model_flags, g);
  engine_options.max_batch = max_batch;
  Engine engine(*g.model, engine_options);
  if (!ignore_eos) request.stop_ids = g.stop_ids;
  request.stop_strings = stops;

  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r = request;
    r.prompt = tokenizer.encode(prompts[i]);
    r.sampling.seed = o.seed + i;
    requests.push_back(std::move(r));
  }
  // With --profile the engine is stepped here, inside Megatron's profiler window (steps 10, 11).
  TrainConfig profile_window;
  profile_window.profile = profile;
  if (values.count("--tensorboard-dir")) profile_window.tensorboard_dir = values["--tensorboard-dir"];
  StepProfiler profiler(profile_window, g.parallel.rank, g.device);
  // Under tensor parallelism every rank generates the same text; the first prints it.
  const bool prints = g.parallel.rank == 0;
  auto run = [&](std::vector<GenerationRequest> all) {
    std::vector<int64_t> ids;
    for (auto& r : all) ids.push_back(engine.submit(std::move(r)));
    for (int64_t step = 0; !engine.idle(); ++step) {
      profiler.before_iteration(step);
      engine.step();
      profiler.after_iteration(step + 1);
    }
    std::vector<GenerationResult> results;
    for (int64_t id : ids) results.push_back(*engine.take_result(id));
    return results;
  };
  if (g.device.is_cuda() && !requests.empty()) {
    // The first forward of a run on a GPU is cold (CUDA loads each kernel on its first launch, the
    // libraries set up their handles): 125-131 ms for a 134-token prompt of the 1.1B shape on an
    // H100 (HF's compiled prefill of it, timed warm: 28 ms). One throwaway greedy run of the first prompt (two new
    // tokens) takes that cost here, and the figures below count the run proper, as HF's compiled
    // generate is timed after its warm-up. Every rank runs it: the collectives stay in step.
    const double seconds = engine.warm_up(requests[0].prompt);
    if (prints) std::fprintf(stderr, "> warm-up: %.1f ms (the first prompt once, two tokens; not in the figures below)\n", 1e3 * seconds);
  }
  if (prints) {
    std::fprintf(stderr, "> %s: %zu prompt(s), sampling %s%s\n", g.source.c_str(), prompts.size(),
                 o.greedy || o.temperature == 0 ? "greedily" : "with temperature / top-k / top-p / min-p",
                 tensor_parallel_note(g, ", ").c_str());
  }
  if (!prints) {
    run(std::move(requests));
  } else if (prompts.size() == 1 && stops.empty()) {
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
    run(std::move(requests));
    std::fputs("\n", stdout);
  } else {
    const std::vector<GenerationResult> results = run(std::move(requests));
    for (size_t i = 0; i < results.size(); ++i) {
      if (prompts.size() > 1) std::printf("--- %zu (%s)\n", i + 1, results[i].finish_reason.c_str());
      std::printf("%s%s\n", prompts[i].c_str(), results[i].text.c_str());
    }
  }
  if (g.world) g.world->shutdown();
  if (!prints) return 0;
  const EngineStats& t = engine.stats();
  std::fprintf(stderr, "> prefill: %lld tokens in %lld forwards, %.1f ms (%.0f tokens/s); decode: %lld steps, %lld tokens in %.1f ms "
               "(%.3f ms a step, %.0f tokens/s; %s)\n", (long long)t.prefill_tokens, (long long)t.prefills, 1e3 * t.prefill_seconds,
               t.prefill_tokens / std::max(t.prefill_seconds, 1e-9), (long long)t.decode_steps, (long long)t.decode_tokens,
               1e3 * t.decode_seconds, 1e3 * t.decode_seconds / std::max<int64_t>(t.decode_steps, 1),
               t.decode_tokens / std::max(t.decode_seconds, 1e-9),
               (engine.decode_mode() + (engine_options.decode_ahead ? ", " + std::to_string(t.steps_ahead) + " launched ahead" : "") +
                decode_kernels_note(asked_decode_kernels(model_flags), engine.decode_kernels_run()) + captures_note(t))
                   .c_str());
  return 0;
}

}  // namespace megatron::cli
