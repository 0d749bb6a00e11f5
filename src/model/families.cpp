// The families built in. Presets mirror what Megatron-Bridge / Pai-Megatron-Patch launch scripts
// pass for each family; the weight tables are Megatron-Bridge's mappings for them.
#include "model/families.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>

#include "core/errors.h"
#include "model/family.h"
#include "model/llama_parts.h"
#include "model/deepseek_family.h"
#include "model/moe_families.h"

namespace megatron {

// The FLOPs of a dense decoder: 6 per parameter (forward + backward GEMMs) plus attention's
// scores and values, 6 * L * h * s per token with causal masking counted as half.
double dense_flops_per_token(const ModelConfig& m, int64_t parameters) {
  return 6.0 * double(parameters) + 6.0 * m.num_layers * double(m.hidden_size) * m.seq_length;
}

// ---- Llama family: Llama 2/3/3.1, Mistral, Qwen2/2.5 (qkv bias), Qwen3 (q/k norm) ----------

// RMSNorm, SwiGLU, RoPE, no linear biases, no dropout, untied output layer.
void llama_like(ModelConfig& m) {
  m.normalization = "RMSNorm";
  m.swiglu = true;
  m.position_embedding_type = "rope";
  m.add_bias_linear = false;
  m.hidden_dropout = 0.0;
  m.attention_dropout = 0.0;
  m.untie_embeddings_and_output_weights = true;
}

ModelConfig llama_config_from_hf(const nlohmann::json& j, const std::string& path) {
  const std::string type = j.value("model_type", "");
  ModelConfig m;
  llama_like(m);
  m.num_layers = j.at("num_hidden_layers");
  m.hidden_size = j.at("hidden_size");
  m.ffn_hidden_size = j.at("intermediate_size");
  m.num_attention_heads = j.at("num_attention_heads");
  m.num_query_groups = j.value("num_key_value_heads", m.num_attention_heads);
  m.group_query_attention = m.num_query_groups != m.num_attention_heads;
  m.kv_channels = j.contains("head_dim") && !j["head_dim"].is_null() ? j["head_dim"].get<int>()
                                                                      : m.hidden_size / m.num_attention_heads;
  m.vocab_size = j.at("vocab_size");
  m.padded_vocab_size = m.vocab_size;
  m.max_position_embeddings = j.value("max_position_embeddings", 4096);
  m.seq_length = std::min(m.max_position_embeddings, 4096);
  m.norm_epsilon = j.value("rms_norm_eps", 1e-6);
  m.add_qkv_bias = type == "qwen2" || type == "qwen2_moe" || j.value("attention_bias", false);
  m.qk_layernorm = type == "qwen3" || type == "qwen3_moe";
  m.untie_embeddings_and_output_weights = !j.value("tie_word_embeddings", false);
  // transformers v5 writes rope_parameters, earlier versions rope_theta + rope_scaling.
  nlohmann::json rope = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"]
                        : j.contains("rope_scaling") && j["rope_scaling"].is_object()   ? j["rope_scaling"]
                                                                                        : nlohmann::json::object();
  m.rotary_base = rope.value("rope_theta", j.value("rope_theta", 10000.0));
  const std::string rope_type = rope.value("rope_type", rope.value("type", std::string("default")));
  if (rope_type == "llama3") {
    m.use_rope_scaling = true;
    m.rope_scaling_factor = rope.at("factor");
    m.rope_low_freq_factor = rope.value("low_freq_factor", 1.0);
    m.rope_high_freq_factor = rope.value("high_freq_factor", 4.0);
    m.rope_original_max_position_embeddings = rope.value("original_max_position_embeddings", 8192);
  } else if (rope_type == "linear") {
    m.rotary_seq_len_interpolation_factor = rope.at("factor");
  } else if (rope_type != "default") {
    throw UserError(path + ": rope type '" + rope_type + "' is not supported yet (default, llama3, linear)");
  }
  return m;
}

nlohmann::json llama_config_to_hf(const ModelConfig& m, int64_t hf_vocab, at::ScalarType dtype) {
  const std::string type = m.qk_layernorm ? "qwen3" : m.add_qkv_bias ? "qwen2" : "llama";
  const std::string arch = type == "qwen3" ? "Qwen3ForCausalLM" : type == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  nlohmann::json j = {{"architectures", {arch}},
                      {"model_type", type},
                      {"hidden_size", m.hidden_size},
                      {"intermediate_size", m.ffn_hidden_size},
                      {"num_hidden_layers", m.num_layers},
                      {"num_attention_heads", m.num_attention_heads},
                      {"num_key_value_heads", m.num_query_groups},
                      {"head_dim", m.kv_channels},
                      {"vocab_size", hf_vocab},
                      {"max_position_embeddings", m.max_position_embeddings},
                      {"rms_norm_eps", m.norm_epsilon},
                      {"rope_theta", m.rotary_base},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", !m.untie_embeddings_and_output_weights},
                      {"torch_dtype", dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32"}};
  if (type == "llama") j["attention_bias"] = false;
  if (m.rotary_seq_len_interpolation_factor != 1.0) {
    if (m.use_rope_scaling) {
      throw UserError("--save-hf: HF has no rope scaling that is both Llama 3.1's and linear interpolation "
                      "(--use-rope-scaling with --rotary-seq-len-interpolation-factor)");
    }
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", m.rotary_seq_len_interpolation_factor}};
  }
  if (m.use_rope_scaling) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", m.rope_scaling_factor},
                         {"low_freq_factor", m.rope_low_freq_factor},
                         {"high_freq_factor", m.rope_high_freq_factor},
                         {"original_max_position_embeddings", m.rope_original_max_position_embeddings}};
  }
  return j;
}

std::vector<HfWeightRule> llama_weights() {
  const std::string L = "decoder.layers.{layer}.", H = "model.layers.{layer}.";
  return {
      {"embedding.word_embeddings.weight", {"model.embed_tokens.weight"}, HfTransform::VocabRows},
      {L + "self_attention.linear_qkv.layer_norm_weight", {H + "input_layernorm.weight"}},
      {L + "self_attention.linear_qkv.weight",
       {H + "self_attn.q_proj.weight", H + "self_attn.k_proj.weight", H + "self_attn.v_proj.weight"}, HfTransform::QkvFused},
      {L + "self_attention.linear_qkv.bias",
       {H + "self_attn.q_proj.bias", H + "self_attn.k_proj.bias", H + "self_attn.v_proj.bias"}, HfTransform::QkvFused},
      {L + "self_attention.q_layernorm.weight", {H + "self_attn.q_norm.weight"}},
      {L + "self_attention.k_layernorm.weight", {H + "self_attn.k_norm.weight"}},
      {L + "self_attention.linear_proj.weight", {H + "self_attn.o_proj.weight"}},
      {L + "mlp.linear_fc1.layer_norm_weight", {H + "post_attention_layernorm.weight"}},
      {L + "mlp.linear_fc1.weight", {H + "mlp.gate_proj.weight", H + "mlp.up_proj.weight"}, HfTransform::GateUp},
      {L + "mlp.linear_fc2.weight", {H + "mlp.down_proj.weight"}},
      {"decoder.final_layernorm.weight", {"model.norm.weight"}},
      {"output_layer.weight", {"lm_head.weight"}, HfTransform::VocabRows, "model.embed_tokens.weight"},
  };
}

namespace {

ModelFamily llama_family() {
  ModelFamily f;
  f.name = "llama";
  f.presets = {
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
  f.hf_model_types = {"llama", "mistral", "qwen2", "qwen3"};
  f.describes = [](const ModelConfig& m) {
    return m.num_experts == 0 && !m.multi_latent_attention && m.normalization == "RMSNorm" && m.swiglu && !m.add_bias_linear && m.position_embedding_type == "rope";
  };
  f.config_from_hf = llama_config_from_hf;
  f.config_to_hf = llama_config_to_hf;
  f.weights = llama_weights();
  f.layer_spec = gpt_layer_spec;
  f.flops_per_token = dense_flops_per_token;
  return f;
}

// ---- GPT: what the flags build without a family (LayerNorm, GELU, learned positions, ...) ----

ModelFamily gpt_family() {
  ModelFamily f;
  f.name = "gpt";
  f.describes = [](const ModelConfig&) { return true; };
  f.layer_spec = gpt_layer_spec;
  f.flops_per_token = dense_flops_per_token;
  return f;
}

}  // namespace

const std::vector<ModelFamily>& builtin_families() {
  // gpt last: it describes any model; the MoE families before llama, which does not read experts;
  // DeepSeek first, the only one with multi-latent attention.
  static const std::vector<ModelFamily> families = {deepseek_family(), mixtral_family(), qwen_moe_family(), llama_family(),
                                                    gpt_family()};
  return families;
}

std::vector<std::string> known_model_families() {
  std::vector<std::string> names;
  for (const auto& f : builtin_families()) {
    for (const auto& kv : f.presets) names.push_back(kv.first);
  }
  std::sort(names.begin(), names.end());
  return names;
}

const ModelFamily& family_with_preset(const std::string& preset) {
  for (const auto& f : builtin_families()) {
    if (f.presets.count(preset)) return f;
  }
  std::ostringstream msg;
  msg << "--model-family: unknown family '" << preset << "'; known:";
  for (const auto& name : known_model_families()) msg << " " << name;
  throw UserError(msg.str());
}

void apply_model_family(const std::string& preset, ModelConfig& model) { family_with_preset(preset).presets.at(preset)(model); }

const ModelFamily& family_for_hf_type(const std::string& type, const std::string& path) {
  std::string known;
  for (const auto& f : builtin_families()) {
    for (const auto& t : f.hf_model_types) {
      if (t == type) return f;
      known += (known.empty() ? "" : ", ") + t;
    }
  }
  throw UserError(path + ": model_type '" + type + "' is not supported yet (" + known + ")");
}

const ModelFamily& family_of(const ModelConfig& model) {
  if (model.family != nullptr) return *model.family;
  for (const auto& f : builtin_families()) {
    if (f.describes(model)) return f;
  }
  TORCH_CHECK(false, "no model family describes the model");  // gpt describes every model
}

}  // namespace megatron
