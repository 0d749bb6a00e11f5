// One record per model family: everything that makes, say, Llama / Qwen / Mistral what they are,
// in one place. Adding a family is adding a record (families.cpp):
//   - presets: `--model-family NAME` sets the architecture switches, so a recipe states sizes only
//   - Hugging Face config.json in and out (the `model_type`s it reads)
//   - a two-way weight table: HF tensor names <-> Megatron-Core names with the transform between
//     them; convert, --load-hf and --save-hf read the same rows both ways (checkpoint/hf_mapping)
//   - the decoder layer's spec, the micro-batch loss and the FLOPs per token the MFU figure
//     divides by
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/layer_spec.h"
#include "model/loss.h"

namespace megatron {

// How the HF tensors of a row become the Megatron tensor (and back).
enum class HfTransform {
  Copy,       // one tensor, unchanged
  VocabRows,  // embedding / output layer: HF's rows, zero rows appended up to the padded vocabulary
  QkvFused,   // q, k, v (weights or biases) fused per query group: H/G query heads, one key, one value head
  GateUp,     // SwiGLU's [gate; up] stacked along dim 0
};

// One row of a weight table. `{layer}` in a name stands for a decoder layer's number,
// `{expert}` for an MoE expert's.
struct HfWeightRule {
  std::string megatron;          // "decoder.layers.{layer}.self_attention.linear_qkv.weight"
  std::vector<std::string> hf;   // "model.layers.{layer}.self_attn.q_proj.weight", k_proj, v_proj
  HfTransform transform = HfTransform::Copy;
  // Read instead when the HF checkpoint lacks hf[0] (an untied output layer of a checkpoint
  // whose lm_head is the embedding).
  std::string hf_fallback;
};

struct ModelFamily {
  std::string name;                                            // "llama"
  std::map<std::string, std::function<void(ModelConfig&)>> presets;  // --model-family values
  std::vector<std::string> hf_model_types;                     // config.json model_type values read
  // Whether `model` is of this family (which record exports a model trained from flags).
  std::function<bool(const ModelConfig&)> describes;
  // config.json -> the architecture (vocabulary unpadded); `path` names the file in errors.
  std::function<ModelConfig(const nlohmann::json& config, const std::string& path)> config_from_hf;
  // The architecture -> config.json with `hf_vocab` rows, weights in `dtype`.
  std::function<nlohmann::json(const ModelConfig& model, int64_t hf_vocab, at::ScalarType dtype)> config_to_hf;
  std::vector<HfWeightRule> weights;
  std::function<LayerSpec(const ModelConfig&)> layer_spec;
  // The micro-batch loss (empty: masked_token_mean) and the names of the terms it reports; every
  // rank must know the names before the first step (they are reduced over DP and sent to every
  // pipeline stage in this order).
  LossFunction loss;
  std::vector<std::string> loss_terms;
  // Training FLOPs per token (forward + backward) for a model of `parameters` parameters.
  std::function<double(const ModelConfig&, int64_t parameters)> flops_per_token;
};

// The families built in.
const std::vector<ModelFamily>& builtin_families();
// The family whose presets hold `preset`, whose hf_model_types hold `model_type`, or of
// `model` (its `family` record when set, else the built-in one that describes it); UserError
// listing what is known otherwise.
const ModelFamily& family_with_preset(const std::string& preset);
const ModelFamily& family_for_hf_type(const std::string& model_type, const std::string& path);
const ModelFamily& family_of(const ModelConfig& model);

}  // namespace megatron
