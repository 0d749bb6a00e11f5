// `megatron generate --load DIR --prompt TEXT [sampling flags]`: rebuilds the model and the
// tokenizer from the checkpoint's own record, then streams the continuation to stdout.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "core/config_json.h"
#include "core/errors.h"
#include "inference/generate.h"
#include "model/gpt_model.h"
#include "tokenizer/tokenizer.h"
#include "train/arguments.h"
#include "train/rank_resources.h"

namespace megatron::cli {
namespace {

const char* kHelp =
    "usage: megatron generate --load DIR --prompt TEXT [flags]\n\n"
    "Samples a continuation of TEXT from the latest checkpoint under DIR. The model and the\n"
    "tokenizer are those the checkpoint was trained with.\n\n"
    "  --load DIR                checkpoint directory (as given to train --save)\n"
    "  --prompt TEXT             text to continue\n"
    "  --max-new-tokens N        tokens to generate (default 64; --out-seq-length is an alias)\n"
    "  --greedy                  always take the most likely token\n"
    "  --temperature T           sampling temperature (default 1.0)\n"
    "  --top-k K                 sample among the K most likely tokens (default 0: all)\n"
    "  --top-p P                 sample among the most likely tokens holding probability P (default 1.0)\n"
    "  --seed S                  sampling seed (default 1234)\n"
    "  --tokenizer-model PATH    use this tokenizer file instead of the one recorded in the checkpoint\n"
    "  --device auto|cpu|cuda    where to run (default auto)\n"
    "  --cpu-threads N           intra-op threads on CPU (default: one per core)\n";

double number(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  // Finite and within 2^53: the integer flags are cast from it.
  if (text.empty() || *end != '\0' || !std::isfinite(v) || std::fabs(v) > 9007199254740992.0) {
    throw UserError(flag + ": expected a finite number, got '" + text + "'");
  }
  return v;
}

}  // namespace

int generate(const Args& args) {
  std::map<std::string, std::string> values;
  bool greedy = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    }
    if (a == "--greedy") {
      greedy = true;
      continue;
    }
    static const char* known[] = {"--load", "--prompt", "--max-new-tokens", "--out-seq-length", "--temperature", "--top-k",
                                  "--top-p", "--seed", "--tokenizer-model", "--device", "--cpu-threads"};
    if (std::find(std::begin(known), std::end(known), a) == std::end(known)) {
      throw UserError("unknown flag " + a + " for generate; see megatron generate --help");
    }
    if (i + 1 >= args.size()) throw UserError(a + ": expects a value");
    values[a == "--out-seq-length" ? "--max-new-tokens" : a] = args[++i];
  }
  if (!values.count("--load")) throw UserError("generate needs --load DIR (a checkpoint directory)");
  if (!values.count("--prompt")) throw UserError("generate needs --prompt TEXT");

  SamplingOptions o;
  o.greedy = greedy;
  if (values.count("--max-new-tokens")) o.max_new_tokens = static_cast<int64_t>(number("--max-new-tokens", values["--max-new-tokens"]));
  if (values.count("--temperature")) o.temperature = number("--temperature", values["--temperature"]);
  if (values.count("--top-k")) o.top_k = static_cast<int64_t>(number("--top-k", values["--top-k"]));
  if (values.count("--top-p")) o.top_p = number("--top-p", values["--top-p"]);
  if (values.count("--seed")) o.seed = static_cast<uint64_t>(number("--seed", values["--seed"]));
  if (o.max_new_tokens < 1 || o.temperature < 0 || o.top_k < 0 || o.top_p <= 0 || o.top_p > 1) {
    throw UserError("generate: need --max-new-tokens >= 1, --temperature >= 0, --top-k >= 0, 0 < --top-p <= 1");
  }
  const double threads_flag = values.count("--cpu-threads") ? number("--cpu-threads", values["--cpu-threads"])
                                                            : double(std::max(1u, std::thread::hardware_concurrency()));
  if (!(threads_flag >= 1 && threads_flag <= kMaxCpuThreads)) {
    throw UserError("--cpu-threads must be from 1 to " + std::to_string(kMaxCpuThreads) + ", got " + values["--cpu-threads"]);
  }
  at::set_num_threads(static_cast<int>(threads_flag));

  const std::string dir = latest_checkpoint_directory(values["--load"]);
  if (dir.empty()) throw UserError("--load " + values["--load"] + ": no latest_checkpointed_iteration.txt; is this a checkpoint directory?");
  const nlohmann::json state = read_checkpoint_state(dir);
  const ModelConfig model_config = saved_model_config(dir, state);  // checked field by field
  if (!state.contains("tokenizer")) {
    throw UserError(dir + "/state.json records no tokenizer: it was saved by an older version, or is damaged");
  }
  DataConfig data;
  try {
    tokenizer_config_from_json(state["tokenizer"], data);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(dir + "/state.json: tokenizer: a field is missing or of the wrong type (" + e.what() + ")");
  }
  if (values.count("--tokenizer-model")) data.tokenizer_model = values["--tokenizer-model"];
  // The model's vocab_size is the tokenizer's ids: NullTokenizer's N plus EOD, TikTokenizer's all.
  const int64_t vocab_flag = data.tokenizer_type == "NullTokenizer"  ? model_config.vocab_size - 1
                             : data.tokenizer_type == "TikTokenizer" ? model_config.vocab_size
                                                                     : 0;
  auto tokenizer = make_tokenizer(tokenizer_spec(data, vocab_flag));

  const std::string device_flag = values.count("--device") ? values["--device"] : "auto";
  if (device_flag == "cuda" && !at::hasCUDA()) throw UserError("--device cuda: no CUDA device here; use --device cpu");
  const at::Device device = (device_flag == "cuda" || (device_flag == "auto" && at::hasCUDA())) ? at::Device(at::kCUDA, 0)
                                                                                                : at::Device(at::kCPU);
  GPTModel model(model_config);
  load_model_weights(dir, model);
  model.to(device);

  std::vector<int64_t> prompt = tokenizer->encode(values["--prompt"]);
  std::fprintf(stderr, "> %s: %zu prompt tokens, sampling %s\n", dir.c_str(), prompt.size(),
               o.greedy ? "greedily" : "with temperature / top-k / top-p");
  std::fputs(values["--prompt"].c_str(), stdout);
  // Decode prompt + continuation each time and print what is new: tokenizers that drop a
  // leading space (SentencePiece) and characters split across tokens then come out right.
  std::vector<int64_t> all = prompt;
  std::string printed = tokenizer->decode(prompt);
  auto on_token = [&](int64_t id) {
    all.push_back(id);
    const std::string text = tokenizer->decode(all);
    if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
      std::fputs(text.c_str() + printed.size(), stdout);
      std::fflush(stdout);
      printed = text;
    }
  };
  megatron::generate(model, prompt, o, model_config.vocab_size, tokenizer->eod_id(), on_token);
  std::fputs("\n", stdout);
  return 0;
}

}  // namespace megatron::cli
