// `megatron convert`: Hugging Face safetensors and Megatron-LM checkpoints <-> native checkpoints,
// streaming (one tensor at a time beyond the output file being written).
//   --from hf --to native --load HF_DIR --save DIR [--target-tensor-parallel-size T]
//                         [--target-pipeline-parallel-size P]
//   --from megatron --to native --load MEGATRON_SAVE_DIR --save DIR [--target-*-parallel-size]
//   --from native --to hf --load DIR --save HF_DIR [--max-shard-size 5GB]
#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_export.h"
#include "checkpoint/hf_mapping.h"
#include "checkpoint/megatron_args.h"
#include "checkpoint/megatron_checkpoint.h"
#include "checkpoint/reshard.h"
#include "checkpoint/safetensors.h"
#include "cli/commands.h"
#include "core/config_json.h"
#include "core/errors.h"
#include "core/files.h"
#include "core/json_text.h"
#include "model/gpt_model.h"
#include "pipeline/layout.h"
#include "tensor_parallel/sharding.h"

namespace megatron::cli {
namespace fs = std::filesystem;
namespace {

const char* kHelp =
    "usage: megatron convert --from hf|megatron|native --to native|hf --load SRC --save DST [flags]\n\n"
    "Converts Hugging Face model directories (config.json + safetensors, sharded or not) and\n"
    "Megatron-LM checkpoints to native checkpoints, and native checkpoints to Hugging Face. Tensors\n"
    "stream one at a time; the source is memory-mapped.\n\n"
    "  --from hf --to native      HF_DIR -> a weights-only checkpoint (DST/iter_0000000); train\n"
    "                             from it with `megatron train --load DST --finetune`\n"
    "  --from megatron --to native  a Megatron-LM checkpoint (torch_dist or legacy --ckpt-format torch):\n"
    "                             SRC is its --save directory or an iter_* directory in it; the\n"
    "                             model's shape (dense, MoE, MLA, MTP) comes from the arguments saved\n"
    "                             with it. Written at the run's iteration with the samples it consumed:\n"
    "                             `train --load DST --no-load-optim --no-load-rng` goes on with that\n"
    "                             run's data order (a fresh optimizer and learning-rate schedule, as\n"
    "                             Megatron's --no-load-optim), `--finetune` starts over at 0\n"
    "  --from native --to hf      the latest checkpoint under SRC -> config.json, safetensors\n"
    "                             shards + index, tokenizer files\n"
    "  --target-tensor-parallel-size T     split for T tensor-parallel ranks (-> native; default 1)\n"
    "  --target-pipeline-parallel-size P   split the layers over P pipeline stages (-> native; default 1)\n"
    "  --target-expert-parallel-size E     MoE: each of E expert-parallel ranks' experts in a file of its own\n"
    "                                      (-> native; default 1; any EP size loads either way)\n"
    "  --make-vocab-size-divisible-by N    pad the vocabulary to a multiple of N x T (default 128)\n"
    "  --max-shard-size SIZE               largest HF shard, e.g. 5GB, 500MB or bytes (default 5GB)\n";

int64_t parse_size(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const std::string unit = end;
  const double scale = unit == "" || unit == "B" ? 1 : unit == "KB" ? 1e3 : unit == "MB" ? 1e6 : unit == "GB" ? 1e9 : -1;
  if (end == text.c_str() || scale < 0 || v <= 0) {
    throw UserError("--max-shard-size: expected a size such as 5GB, 500MB or a byte count, got '" + text + "'");
  }
  return static_cast<int64_t>(v * scale);
}

int positive(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 1) throw UserError(flag + ": expected a positive integer, got '" + text + "'");
  return static_cast<int>(v);
}

// Every parameter's whole (unsplit) shape in the model `m` describes (built on the meta device:
// nothing allocated).
std::map<std::string, std::vector<int64_t>> full_parameter_shapes(const ModelConfig& m) {
  GPTModel shapes(m, {}, std::nullopt, std::nullopt, at::kMeta);
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& p : shapes.named_parameters()) out[p.key()] = p.value().sizes().vec();
  return out;
}

// Writes the weights-only checkpoint of `config`'s model and layout (TP, PP, EP), each parameter
// cut from the whole tensor `full_tensor(name)` gives; `check_source` runs once every file is
// written and before the checkpoint is published (an error there leaves nothing loadable).
// Returns whether every tensor was bf16.
bool write_native_checkpoint(const std::string& save, const Config& config,
                             const std::function<at::Tensor(const std::string&)>& full_tensor,
                             const std::map<std::string, std::string>& extra_files, const std::function<void()>& check_source,
                             const TrainingProgress& progress = TrainingProgress()) {
  const ModelConfig& m = config.model;
  const int tp = config.parallel.tensor_model_parallel_size, pp = config.parallel.pipeline_model_parallel_size;
  const int ep = config.parallel.expert_model_parallel_size;
  // What each pipeline stage holds, described by the model built on the meta device (nothing
  // allocated): its chunks' parameters, how each splits over TP.
  std::vector<tp::ParamTable> stages(static_cast<size_t>(pp));
  tp::ParamTable all;
  for (int stage = 0; stage < pp; ++stage) {
    for (int v = 0; v < config.parallel.num_virtual_stages_per_pipeline_rank; ++v) {
      stages[size_t(stage)].merge(describe_model(m, pipeline::chunk_layers(config.parallel, m.num_layers, stage, v)));
    }
    all.merge(stages[size_t(stage)]);
  }
  bool bf16 = true;
  const int experts_per_rank = m.num_experts > 0 ? m.num_experts / ep : 1;
  save_weights_checkpoint(save, config, all, [&](int rank, int stage, int ep_rank, const std::string& path) {
    std::vector<SafetensorsEntry> entries;
    const tp::ParamTable& held = stages[size_t(stage)];
    for (const auto& name : held.names()) {
      // Under expert parallelism the first file holds the dense tensors, each EP rank's its experts.
      const int expert = held.at(name).expert;
      if (ep > 1 && (ep_rank < 0 ? expert >= 0 : expert < 0 || expert / experts_per_rank != ep_rank)) continue;
      const at::Tensor full = full_tensor(name);
      bf16 = bf16 && full.scalar_type() == at::kBFloat16;
      entries.push_back({name, tp::shard_of(full, held.at(name).split, rank, tp).contiguous()});
    }
    save_safetensors(path, entries, {{"format", "megatron.cpp"},
                                     {"tensor_parallel_rank", std::to_string(rank)},
                                     {"tensor_parallel_size", std::to_string(tp)},
                                     {"pipeline_parallel_rank", std::to_string(stage)}});
    std::printf("convert: wrote %s (%zu tensors)\n", path.c_str(), entries.size());
    std::fflush(stdout);
  }, extra_files, check_source, progress);
  return bf16;
}

void hf_to_native(const std::string& hf_dir, const std::string& save, int tp, int pp, int ep, int divisible,
                  const ModelFamily* family) {
  Config config;
  ModelConfig& m = config.model;
  m = model_config_from_hf(hf_dir, family);
  config.parallel.tensor_model_parallel_size = tp;
  config.parallel.pipeline_model_parallel_size = pp;
  config.parallel.expert_model_parallel_size = ep;
  pipeline::check_pipeline_layout(config.parallel, m.num_layers);
  if (ep > 1 && (m.num_experts == 0 || m.num_experts % ep != 0)) {
    throw UserError("--target-expert-parallel-size " + std::to_string(ep) + ": " + hf_dir + "/config.json has " +
                    std::to_string(m.num_experts) + " experts, which " + (m.num_experts == 0 ? "leaves nothing to split" : "do not split evenly"));
  }
  m.hf_vocab_size = m.vocab_size;
  m.make_vocab_size_divisible_by = divisible;
  const int64_t multiple = int64_t(divisible) * tp;
  m.padded_vocab_size = static_cast<int>((m.vocab_size + multiple - 1) / multiple * multiple);
  for (auto [what, n] : {std::pair<const char*, int>{"num_attention_heads", m.num_attention_heads},
                         {"num_key_value_heads", m.num_query_groups},
                         {"intermediate_size", m.ffn_hidden_size},
                         {"moe_intermediate_size", m.num_experts > 0 ? m.expert_ffn_hidden_size() : 0},
                         {"shared_expert_intermediate_size", m.moe_shared_expert_intermediate_size}}) {
    if (n % tp != 0) {
      throw UserError(hf_dir + "/config.json: " + what + " " + std::to_string(n) + " does not split into " +
                      std::to_string(tp) + " tensor-parallel parts");
    }
  }
  if (fs::exists(hf_dir + "/tokenizer.json")) {
    config.data.tokenizer_type = "HuggingFaceTokenizer";
    config.data.tokenizer_model = hf_dir;
  }
  HfCheckpointReader hf(hf_dir);
  const auto shapes = full_parameter_shapes(m);
  const bool bf16 = write_native_checkpoint(
      save, config, [&](const std::string& name) { return megatron_tensor_from_hf(name, m, hf, shapes.at(name)); },
      {{"hf_config.json", hf_dir + "/config.json"}}, [&] {
        ignore_unbuilt_hf_layers(hf, m);
        hf.check_all_used();
      });
  std::printf("convert: %s -> %s (tensor parallel %d, pipeline parallel %d, expert parallel %d, padded vocabulary %d, %s)\n",
              hf_dir.c_str(), save.c_str(), tp, pp, ep, m.padded_vocab_size, bf16 ? "bf16" : "as stored");
}

// A Megatron-LM checkpoint (torch_dist or legacy) -> a weights-only native checkpoint, the
// model's shape from the saving run's arguments.
void megatron_to_native(const std::string& load, const std::string& save, int tp, int pp, int ep) {
  const MegatronCheckpoint checkpoint(load);
  Config config;
  ModelConfig& m = config.model;
  m = model_config_from_megatron_args(checkpoint.args(), checkpoint.directory());
  // Megatron-LM has no --moe-shared-expert-gate (Megatron-Core's config does): a gate saved
  // beside the shared experts says the run had one.
  for (const std::string& name : checkpoint.names()) {
    const std::string gate = ".mlp.shared_experts.gate_weight";
    if (name.size() > gate.size() && name.compare(name.size() - gate.size(), gate.size(), gate) == 0) m.moe_shared_expert_gate = true;
  }
  config.parallel.tensor_model_parallel_size = tp;
  config.parallel.pipeline_model_parallel_size = pp;
  config.parallel.expert_model_parallel_size = ep;
  pipeline::check_pipeline_layout(config.parallel, m.num_layers);
  const int expert_ffn = m.num_experts > 0 ? m.expert_ffn_hidden_size() : 0;
  if (m.padded_vocab_size % tp != 0 || m.num_query_groups % tp != 0 || m.ffn_hidden_size % tp != 0 || expert_ffn % tp != 0 ||
      m.moe_shared_expert_intermediate_size % tp != 0) {
    throw UserError("--target-tensor-parallel-size " + std::to_string(tp) + ": the checkpoint's vocabulary (" +
                    std::to_string(m.padded_vocab_size) + " rows), query groups (" + std::to_string(m.num_query_groups) +
                    "), MLP (" + std::to_string(m.ffn_hidden_size) + ") or experts' MLPs (" + std::to_string(expert_ffn) + ", shared " +
                    std::to_string(m.moe_shared_expert_intermediate_size) + ") do not split into that many parts");
  }
  if (ep > 1 && (m.num_experts == 0 || m.num_experts % ep != 0)) {
    throw UserError("--target-expert-parallel-size " + std::to_string(ep) + ": the checkpoint's model has " + std::to_string(m.num_experts) +
                    " experts, which " + (m.num_experts == 0 ? "leaves nothing to split" : "do not split evenly"));
  }
  const pickle::Value& args = checkpoint.args();
  if (const pickle::Value* type = args.get("tokenizer_type"); type && type->kind == pickle::Value::Kind::String) {
    config.data.tokenizer_type = type->text;
    if (const pickle::Value* model = args.get("tokenizer_model"); model && model->kind == pickle::Value::Kind::String) {
      config.data.tokenizer_model = model->text;
    }
  }
  // Where the Megatron run stood: `train --load --no-load-optim --no-load-rng` goes on from there
  // (its iteration, the samples it consumed: the same next batches and learning rate).
  TrainingProgress progress;
  progress.iteration = checkpoint.iteration();
  auto count = [&](const char* name) { return megatron_int_arg(&args, name, 0, checkpoint.directory()); };
  progress.consumed_train_samples = count("consumed_train_samples");
  progress.consumed_valid_samples = count("consumed_valid_samples");
  progress.skipped_train_samples = count("skipped_train_samples");
  const auto expected = full_parameter_shapes(m);
  const tp::ParamTable split_of = describe_model(m);
  std::set<std::string> used;
  size_t done = 0;
  const bool bf16 = write_native_checkpoint(save, config, [&](const std::string& name) {
    const std::string source = megatron_source_name(checkpoint, name);
    if (source.empty()) throw UserError(checkpoint.directory() + ": the checkpoint has no tensor for '" + name + "'");
    used.insert(source);
    at::Tensor full = checkpoint.tensor(source);
    if (checkpoint.parts() > 1) {  // a legacy checkpoint's tensor-parallel shards, joined as the model splits them
      std::vector<at::Tensor> parts = {full};
      for (int r = 1; r < checkpoint.parts(); ++r) parts.push_back(checkpoint.tensor(source, r));
      full = tp::unshard(parts, split_of.at(name).split);
    }
    if (full.sizes().vec() != expected.at(name)) {
      throw UserError(checkpoint.directory() + ": '" + source + "' has shape " + c10::str(full.sizes()) + ", the model its args describe expects " +
                      c10::str(expected.at(name)));
    }
    if (++done % 16 == 0) {
      std::printf("convert: %zu tensors\n", done);
      std::fflush(stdout);
    }
    return full;
  }, {}, [&] {
    for (const std::string& name : checkpoint.names()) {
      if (!used.count(name)) {
        throw UserError(checkpoint.directory() + ": the checkpoint's '" + name + "' has no place in the model its args describe "
                        "(an architecture option convert --from megatron does not map)");
      }
    }
  }, progress);
  const std::string experts = m.num_experts > 0 ? ", " + std::to_string(m.num_experts) + " experts, expert parallel " + std::to_string(ep) : "";
  std::printf("convert: %s (Megatron %s, iteration %lld) -> %s (tensor parallel %d, pipeline parallel %d%s, vocabulary %d, %s)\n",
              checkpoint.directory().c_str(), checkpoint.format() == MegatronCheckpoint::Format::TorchDist ? "torch_dist" : "legacy",
              static_cast<long long>(checkpoint.iteration()), save.c_str(), tp, pp, experts.c_str(), m.padded_vocab_size,
              bf16 ? "bf16" : "as stored");
  std::printf("convert: train --load %s --no-load-optim --no-load-rng goes on from iteration %lld (%lld samples consumed; "
              "a fresh optimizer and learning-rate schedule, as Megatron's --no-load-optim), --finetune starts over at 0\n",
              save.c_str(), static_cast<long long>(progress.iteration), static_cast<long long>(progress.consumed_train_samples));
}

// A native checkpoint (iteration directory `dir`, its state.json `state`) -> an HF directory.
void write_hf_from_native(const std::string& dir, const nlohmann::json& state, const std::string& save, int64_t max_shard_bytes,
                          const ModelFamily* family) {
  ModelConfig m = saved_model_config(dir, state);
  m.family = family;
  // Reads the model files of any saved layout, checksums verified, TP shards joined per tensor.
  const ShardedCheckpointReader reader(dir, state, describe_model(m), /*with_optimizer=*/false);
  HfExportOptions options;
  options.max_shard_bytes = max_shard_bytes;
  int64_t hf_vocab = m.hf_vocab_size > 0 ? m.hf_vocab_size : m.vocab_size;
  if (fs::exists(dir + "/hf_config.json")) {
    options.config_json = dir + "/hf_config.json";
    const nlohmann::json hf_config = parse_json_file(options.config_json);
    if (!hf_config.is_object() || !hf_config.contains("vocab_size") || !hf_config["vocab_size"].is_number_integer()) {
      throw UserError(options.config_json + ": no integer vocab_size (the HF config the checkpoint was converted from)");
    }
    hf_vocab = hf_config["vocab_size"].get<int64_t>();
  }
  const nlohmann::json tokenizer = state.value("tokenizer", nlohmann::json::object());
  const std::string tokenizer_model = tokenizer.value("tokenizer_model", std::string());
  if (tokenizer.value("tokenizer_type", std::string()) == "HuggingFaceTokenizer" && !tokenizer_model.empty()) {
    options.tokenizer_dir = fs::is_directory(tokenizer_model) ? tokenizer_model : fs::path(tokenizer_model).parent_path().string();
  }
  size_t done = 0;
  save_hf_checkpoint(save, m, hf_vocab, [&](const std::string& name) {
    if (++done % 16 == 0) {
      std::printf("convert: %zu tensors\n", done);
      std::fflush(stdout);
    }
    return reader.model(name, m.padded_vocab_size);
  }, options);
  std::printf("convert: %s -> %s (Hugging Face, vocabulary %lld)\n", dir.c_str(), save.c_str(), static_cast<long long>(hf_vocab));
}

void native_to_hf(const std::string& load, const std::string& save, int64_t max_shard_bytes, const ModelFamily* family) {
  std::string dir = fs::exists(load + "/state.json") ? load : latest_checkpoint_directory(load);
  if (dir.empty()) throw UserError(load + ": no checkpoint (no latest_checkpointed_iteration.txt or state.json)");
  const nlohmann::json state = read_checkpoint_state(dir);
  try {
    write_hf_from_native(dir, state, save, max_shard_bytes, family);
  } catch (const nlohmann::json::exception& e) {  // a field of the saved layout or tokenizer
    throw UserError(dir + "/state.json: a field is missing or of the wrong type (" + e.what() + "): the checkpoint is damaged");
  }
}

}  // namespace

static int convert_with(const Args& args, const ModelFamily* family) {
  std::map<std::string, std::string> values;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kHelp, stdout);
      return 0;
    }
    static const char* known[] = {"--from", "--to", "--load", "--save", "--target-tensor-parallel-size",
                                  "--target-pipeline-parallel-size", "--target-expert-parallel-size",
                                  "--make-vocab-size-divisible-by", "--max-shard-size"};
    if (std::find(std::begin(known), std::end(known), a) == std::end(known)) {
      throw UserError("unknown flag " + a + " for convert; see megatron convert --help");
    }
    if (i + 1 >= args.size()) throw UserError(a + ": expects a value");
    values[a] = args[++i];
  }
  for (const char* required : {"--from", "--to", "--load", "--save"}) {
    if (!values.count(required)) throw UserError(std::string("convert needs ") + required + "; see megatron convert --help");
  }
  const std::string from = values["--from"], to = values["--to"];
  if (from == "hf" && to == "native") {
    const int tp = values.count("--target-tensor-parallel-size") ? positive("--target-tensor-parallel-size", values["--target-tensor-parallel-size"]) : 1;
    const int divisible = values.count("--make-vocab-size-divisible-by") ? positive("--make-vocab-size-divisible-by", values["--make-vocab-size-divisible-by"]) : 128;
    const int pp = values.count("--target-pipeline-parallel-size") ? positive("--target-pipeline-parallel-size", values["--target-pipeline-parallel-size"]) : 1;
    const int ep = values.count("--target-expert-parallel-size") ? positive("--target-expert-parallel-size", values["--target-expert-parallel-size"]) : 1;
    hf_to_native(values["--load"], values["--save"], tp, pp, ep, divisible, family);
  } else if (from == "megatron" && to == "native") {
    for (const char* flag : {"--make-vocab-size-divisible-by", "--max-shard-size"}) {
      if (values.count(flag)) throw UserError(std::string(flag) + " does not apply to --from megatron");
    }
    const int tp = values.count("--target-tensor-parallel-size") ? positive("--target-tensor-parallel-size", values["--target-tensor-parallel-size"]) : 1;
    const int pp = values.count("--target-pipeline-parallel-size") ? positive("--target-pipeline-parallel-size", values["--target-pipeline-parallel-size"]) : 1;
    const int ep = values.count("--target-expert-parallel-size") ? positive("--target-expert-parallel-size", values["--target-expert-parallel-size"]) : 1;
    megatron_to_native(values["--load"], values["--save"], tp, pp, ep);
  } else if (from == "native" && to == "hf") {
    for (const char* flag : {"--target-tensor-parallel-size", "--target-pipeline-parallel-size", "--target-expert-parallel-size"}) {
      if (values.count(flag)) throw UserError(std::string(flag) + " applies to --to native only");
    }
    native_to_hf(values["--load"], values["--save"], values.count("--max-shard-size") ? parse_size(values["--max-shard-size"]) : 5000000000LL,
                 family);
  } else {
    throw UserError("convert --from " + from + " --to " + to +
                    ": supported are --from hf --to native, --from megatron --to native and --from native --to hf");
  }
  return 0;
}

int convert(const Args& args) { return convert_with(args, nullptr); }

int convert_as(const ModelFamily& family, const Args& args) { return convert_with(args, &family); }

}  // namespace megatron::cli
