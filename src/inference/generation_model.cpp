#include "inference/generation_model.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_mapping.h"
#include "core/config_json.h"
#include "core/errors.h"
#include "core/json_text.h"
#include "model/gpt_model.h"
#include "pipeline/layout.h"
#include "tokenizer/tokenizer.h"
#include "train/arguments.h"

namespace megatron {
namespace {

namespace fs = std::filesystem;

// eos_token_id of an HF config file: an id, a list of ids, or absent / null.
std::vector<int64_t> eos_ids_of(const std::string& path) {
  const nlohmann::json config = parse_json_file(path);
  std::vector<int64_t> ids;
  if (!config.is_object() || !config.contains("eos_token_id") || config["eos_token_id"].is_null()) return ids;
  const nlohmann::json& eos = config["eos_token_id"];
  for (const nlohmann::json& id : eos.is_array() ? eos : nlohmann::json::array({eos})) {
    if (!id.is_number_integer()) throw UserError(path + ": eos_token_id must be an integer or a list of integers, got " + eos.dump());
    ids.push_back(id.get<int64_t>());
  }
  return ids;
}

// The output layer's rows split over the TP ranks: the padded vocabulary rounded up to a multiple
// of their number (loading pads the new rows; their logits are never candidates: vocab_size).
int padded_for_tensor_parallel(int padded_vocab_size, const dist::ParallelState& ps) {
  const int tp_size = ps.tp.size();
  return (padded_vocab_size + tp_size - 1) / tp_size * tp_size;
}

tp::TensorParallel tensor_parallel_of(const dist::ParallelState& ps) {
  tp::TensorParallel t;  // no sequence parallelism, no dropout generator: generation
  t.group = ps.tp;
  t.experts = ps.ep;
  t.expert_group = ps.expert_tp;
  t.data = ps.dp;
  return t;
}

// This rank's pipeline stage as `split` lays the layers over `ps.pp` (a UserError naming the flag
// when they do not divide); the whole model on one stage.
pipeline::ChunkLayers stage_of(const ModelConfig& m, const dist::ParallelState& ps, const StageSplit& split) {
  ParallelConfig layout;
  layout.tensor_model_parallel_size = ps.tp.size();
  layout.pipeline_model_parallel_size = ps.pp.size();
  layout.decoder_first_pipeline_num_layers = split.first_stage_layers;
  layout.decoder_last_pipeline_num_layers = split.last_stage_layers;
  pipeline::check_pipeline_layout(layout, m.num_layers);
  return pipeline::chunk_layers(layout, m.num_layers, ps.pp.rank(), 0);
}

}  // namespace

GenerationModel load_native_for_generation(const std::string& load_dir, const std::string& tokenizer_model, const at::Device& device,
                                           const dist::ParallelState& ps, const StageSplit& split) {
  const std::string dir = latest_checkpoint_directory(load_dir);
  if (dir.empty()) throw UserError("--load " + load_dir + ": no latest_checkpointed_iteration.txt; is this a checkpoint directory?");
  const nlohmann::json state = read_checkpoint_state(dir);
  ModelConfig model_config = saved_model_config(dir, state);  // checked field by field
  model_config.padded_vocab_size = padded_for_tensor_parallel(model_config.padded_vocab_size, ps);
  if (!state.contains("tokenizer")) {
    throw UserError(dir + "/state.json records no tokenizer: it was saved by an older version, or is damaged");
  }
  DataConfig data;
  try {
    tokenizer_config_from_json(state["tokenizer"], data);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(dir + "/state.json: tokenizer: a field is missing or of the wrong type (" + e.what() + ")");
  }
  if (!tokenizer_model.empty()) data.tokenizer_model = tokenizer_model;
  // The model's vocab_size is the tokenizer's ids: NullTokenizer's N plus EOD, TikTokenizer's all.
  const int64_t vocab_flag = data.tokenizer_type == "NullTokenizer"  ? model_config.vocab_size - 1
                             : data.tokenizer_type == "TikTokenizer" ? model_config.vocab_size
                                                                     : 0;
  GenerationModel g;
  g.tokenizer = make_tokenizer(tokenizer_spec(data, vocab_flag));
  g.model = std::make_shared<GPTModel>(model_config, tensor_parallel_of(ps), stage_of(model_config, ps, split));
  load_model_weights(dir, *g.model, ps);
  g.model->to(device);
  g.device = device;
  if (auto eod = g.tokenizer->eod_id()) g.stop_ids.push_back(*eod);
  g.vocab_size = model_config.vocab_size;
  g.source = dir;
  return g;
}

GenerationModel load_hf_for_generation(const std::string& hf_dir, const std::string& tokenizer_model, const at::Device& device,
                                       bool need_tokenizer, const dist::ParallelState& ps, const StageSplit& split) {
  GenerationModel g;
  ModelConfig model_config = model_config_from_hf(hf_dir);
  model_config.padded_vocab_size = padded_for_tensor_parallel(model_config.padded_vocab_size, ps);
  const std::string tokenizer_path = !tokenizer_model.empty() ? tokenizer_model : hf_dir;
  const bool has_tokenizer = !tokenizer_model.empty() || fs::exists(fs::path(hf_dir) / "tokenizer.json");
  if (has_tokenizer) {
    g.tokenizer = make_tokenizer("HuggingFaceTokenizer", tokenizer_path, "", "", 0);
  } else if (need_tokenizer) {
    throw UserError("--load-hf " + hf_dir + ": no tokenizer.json there; pass --tokenizer-model with the model's tokenizer");
  }
  g.model = std::make_shared<GPTModel>(model_config, tensor_parallel_of(ps), stage_of(model_config, ps, split));
  load_hf_weights(hf_dir, *g.model);
  g.model->to(device);
  g.device = device;
  // HF generate's rule: generation_config.json's eos_token_id, else config.json's.
  const fs::path generation_config = fs::path(hf_dir) / "generation_config.json";
  if (fs::exists(generation_config)) g.stop_ids = eos_ids_of(generation_config.string());
  if (g.stop_ids.empty()) g.stop_ids = eos_ids_of((fs::path(hf_dir) / "config.json").string());
  if (g.stop_ids.empty() && g.tokenizer) {
    if (auto eos = g.tokenizer->eos_id()) g.stop_ids.push_back(*eos);
  }
  g.vocab_size = model_config.vocab_size;
  g.source = hf_dir;
  return g;
}

}  // namespace megatron
