// Presets mirror what Megatron-Bridge / Pai-Megatron-Patch launch scripts pass for each family.
#include "model/families.h"

#include <functional>
#include <map>
#include <sstream>

#include "core/errors.h"

namespace megatron {
namespace {

// Every decoder-only family here: RMSNorm, SwiGLU, RoPE, no linear biases, no dropout.
void llama_like(ModelConfig& m) {
  m.normalization = "RMSNorm";
  m.swiglu = true;
  m.position_embedding_type = "rope";
  m.add_bias_linear = false;
  m.hidden_dropout = 0.0;
  m.attention_dropout = 0.0;
  m.untie_embeddings_and_output_weights = true;
}

const std::map<std::string, std::function<void(ModelConfig&)>>& registry() {
  static const std::map<std::string, std::function<void(ModelConfig&)>> presets = {
      {"llama2", [](ModelConfig& m) { llama_like(m); m.norm_epsilon = 1e-5; m.rotary_base = 10000; }},
      {"llama3", [](ModelConfig& m) { llama_like(m); m.norm_epsilon = 1e-5; m.rotary_base = 500000;
                                      m.group_query_attention = true; }},
      {"llama3.1", [](ModelConfig& m) { llama_like(m); m.norm_epsilon = 1e-5; m.rotary_base = 500000;
                                        m.group_query_attention = true; m.use_rope_scaling = true; }},
      {"mistral", [](ModelConfig& m) { llama_like(m); m.norm_epsilon = 1e-5; m.rotary_base = 1000000;
                                       m.group_query_attention = true; }},
      {"qwen2", [](ModelConfig& m) { llama_like(m); m.norm_epsilon = 1e-6; m.rotary_base = 1000000;
                                     m.group_query_attention = true; m.add_qkv_bias = true; }},
      {"qwen2.5", [](ModelConfig& m) { llama_like(m); m.norm_epsilon = 1e-6; m.rotary_base = 1000000;
                                       m.group_query_attention = true; m.add_qkv_bias = true; }},
      {"qwen3", [](ModelConfig& m) { llama_like(m); m.norm_epsilon = 1e-6; m.rotary_base = 1000000;
                                     m.group_query_attention = true; m.qk_layernorm = true; }},
  };
  return presets;
}

}  // namespace

std::vector<std::string> known_model_families() {
  std::vector<std::string> names;
  for (const auto& kv : registry()) names.push_back(kv.first);
  return names;
}

void apply_model_family(const std::string& family, ModelConfig& model) {
  auto it = registry().find(family);
  if (it == registry().end()) {
    std::ostringstream msg;
    msg << "--model-family: unknown family '" << family << "'; known:";
    for (const auto& name : known_model_families()) msg << " " << name;
    throw UserError(msg.str());
  }
  it->second(model);
}

}  // namespace megatron
