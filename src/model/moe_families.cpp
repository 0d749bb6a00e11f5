// Mixtral and Qwen2-MoE / Qwen3-MoE: the Llama-style decoder (llama_parts.h) with MoE
// feed-forwards. Their weight tables are Megatron-Bridge's mappings: the router is HF's `gate`,
// each expert's [gate; up] becomes linear_fc1.weight<e>, the pre-MLP norm of an MoE layer is the
// layer's pre_mlp_layernorm. HF's auxiliary loss (router_aux_loss_coef, applied by HF to the
// layers' pooled logits and k times Megatron's) is not Megatron's: no coefficient is carried
// over either way; set --moe-aux-loss-coeff.
#include "model/moe_families.h"

#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "model/llama_parts.h"

namespace megatron {
namespace {

// Fields of an HF MoE config.json we cannot honour: an error naming the field.
void refuse(const nlohmann::json& j, const std::string& path, const std::string& field, const std::string& why) {
  throw UserError(path + ": " + field + " = " + j.at(field).dump() + " is not supported: " + why);
}

void check_common(const nlohmann::json& j, const std::string& path) {
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") refuse(j, path, "hidden_act", "the experts are SwiGLU (silu)");
  if (j.value("router_jitter_noise", 0.0) != 0.0) refuse(j, path, "router_jitter_noise", "the router takes no input jitter");
  if (j.value("use_sliding_window", false)) refuse(j, path, "use_sliding_window", "attention has no sliding window");
  if (j.contains("sliding_window") && !j["sliding_window"].is_null() && j.value("use_sliding_window", true) &&
      j.value("model_type", "") == "mixtral") {
    refuse(j, path, "sliding_window", "attention has no sliding window (set it to null)");
  }
}

int experts_of(const nlohmann::json& j, const std::string& path) {
  for (const char* key : {"num_experts", "num_local_experts"}) {
    if (j.contains(key) && j[key].is_number_integer()) return j[key].get<int>();
  }
  throw UserError(path + ": no num_experts (or num_local_experts): is this an MoE config.json?");
}

ModelConfig mixtral_from_hf(const nlohmann::json& j, const std::string& path) {
  check_common(j, path);
  ModelConfig m = llama_config_from_hf(j, path);
  m.num_experts = experts_of(j, path);
  m.moe_router_topk = j.at("num_experts_per_tok");
  m.moe_ffn_hidden_size = m.ffn_hidden_size;  // Mixtral's intermediate_size is each expert's
  m.moe_layers.assign(size_t(m.num_layers), 1);
  m.moe_layer_freq = "1";
  return m;
}

nlohmann::json mixtral_to_hf(const ModelConfig& m, int64_t hf_vocab, at::ScalarType dtype) {
  nlohmann::json j = llama_config_to_hf(m, hf_vocab, dtype);
  j["architectures"] = {"MixtralForCausalLM"};
  j["model_type"] = "mixtral";
  j.erase("attention_bias");
  j["intermediate_size"] = m.expert_ffn_hidden_size();
  j["num_local_experts"] = m.num_experts;
  j["num_experts_per_tok"] = m.moe_router_topk;
  j["sliding_window"] = nullptr;
  j["router_jitter_noise"] = 0.0;
  return j;
}

// Qwen2-MoE (shared experts behind a sigmoid gate, qkv bias, softmax before top-k without
// renormalising) and Qwen3-MoE (q/k norm, renormalised top-k, no shared experts).
ModelConfig qwen_moe_from_hf(const nlohmann::json& j, const std::string& path) {
  check_common(j, path);
  const std::string type = j.value("model_type", "");
  ModelConfig m = llama_config_from_hf(j, path);
  m.num_experts = experts_of(j, path);
  m.moe_router_topk = j.at("num_experts_per_tok");
  m.moe_ffn_hidden_size = j.at("moe_intermediate_size");
  m.moe_router_pre_softmax = !j.value("norm_topk_prob", false);
  if (type == "qwen2_moe") {
    m.moe_shared_expert_intermediate_size = j.value("shared_expert_intermediate_size", 0);
    m.moe_shared_expert_gate = m.moe_shared_expert_intermediate_size > 0;
  } else if (j.value("shared_expert_intermediate_size", 0) > 0) {
    refuse(j, path, "shared_expert_intermediate_size", "Qwen3-MoE has no shared experts");
  }
  // Layer i is an MoE layer unless listed in mlp_only_layers, and only every decoder_sparse_step-th.
  const int step = j.value("decoder_sparse_step", 1);
  if (step < 1) refuse(j, path, "decoder_sparse_step", "must be at least 1");
  m.moe_layers.assign(size_t(m.num_layers), 0);
  for (int i = 0; i < m.num_layers; ++i) m.moe_layers[size_t(i)] = (i + 1) % step == 0 ? 1 : 0;
  if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array()) {
    for (const auto& layer : j["mlp_only_layers"]) {
      const int i = layer.get<int>();
      if (i < 0 || i >= m.num_layers) refuse(j, path, "mlp_only_layers", "lists a layer the model does not have");
      m.moe_layers[size_t(i)] = 0;
    }
  }
  // The list form of --moe-layer-freq, so the flags say the same as config.json.
  std::string freq = "[";
  for (size_t i = 0; i < m.moe_layers.size(); ++i) freq += (i ? "," : "") + std::to_string(m.moe_layers[i]);
  m.moe_layer_freq = freq + "]";
  return m;
}

nlohmann::json qwen_moe_to_hf(const ModelConfig& m, int64_t hf_vocab, at::ScalarType dtype) {
  nlohmann::json j = llama_config_to_hf(m, hf_vocab, dtype);
  const bool qwen3 = m.qk_layernorm;
  j["architectures"] = {qwen3 ? "Qwen3MoeForCausalLM" : "Qwen2MoeForCausalLM"};
  j["model_type"] = qwen3 ? "qwen3_moe" : "qwen2_moe";
  j.erase("attention_bias");
  if (qwen3) j["attention_bias"] = false;
  j["num_experts"] = m.num_experts;
  j["num_experts_per_tok"] = m.moe_router_topk;
  j["moe_intermediate_size"] = m.expert_ffn_hidden_size();
  j["norm_topk_prob"] = !m.moe_router_pre_softmax;
  j["decoder_sparse_step"] = 1;
  nlohmann::json dense = nlohmann::json::array();
  for (int i = 0; i < m.num_layers; ++i) {
    if (!m.is_moe_layer(i)) dense.push_back(i);
  }
  j["mlp_only_layers"] = dense;
  if (!qwen3) j["shared_expert_intermediate_size"] = m.moe_shared_expert_intermediate_size;
  j["use_sliding_window"] = false;
  return j;
}

}  // namespace

// As the dense count but with the parameters a token meets, and attention counted over heads x
// head dims (not the hidden size, which Qwen3-MoE's and MLA's attention do not match).
double moe_flops_per_token(const ModelConfig& m, int64_t parameters) {
  // The multi-token prediction depths are layers built as the decoder's last one, and each runs
  // the shared output layer again (its weight is counted once in `parameters`).
  const int mtp_moe = m.is_moe_layer(m.num_layers - 1) ? m.mtp_num_layers : 0;
  const int moe_layers = m.num_moe_layers() + mtp_moe;
  const double per_expert = 3.0 * m.hidden_size * double(m.expert_ffn_hidden_size());
  const double active = double(parameters) - double(moe_layers) * (m.num_experts - m.moe_router_topk) * per_expert;
  // Attention's scores (query/key dims) and weighted values (value dims), causal: MLA's own
  // head dims, else kv_channels for both.
  const double qk = m.multi_latent_attention ? m.qk_head_dim + m.qk_pos_emb_head_dim : m.kv_channels;
  const double v = m.multi_latent_attention ? m.v_head_dim : m.kv_channels;
  const int attention_layers = m.num_layers + m.mtp_num_layers;
  const double mtp_output = 6.0 * m.mtp_num_layers * double(m.padded_vocab_size) * m.hidden_size;
  return 6.0 * active + mtp_output + 3.0 * attention_layers * double(m.num_attention_heads) * (qk + v) * m.seq_length;
}

std::vector<HfWeightRule> moe_expert_rows(const std::string& hf_moe, const char* gate, const char* up, const char* down) {
  const std::string L = "decoder.layers.{layer}.", H = "model.layers.{layer}." + hf_moe + ".";
  return {
      {L + "pre_mlp_layernorm.weight", {"model.layers.{layer}.post_attention_layernorm.weight"}},
      {L + "mlp.router.weight", {H + "gate.weight"}},
      {L + "mlp.experts.linear_fc1.weight{expert}", {H + "experts.{expert}." + gate + ".weight", H + "experts.{expert}." + up + ".weight"},
       HfTransform::GateUp},
      {L + "mlp.experts.linear_fc2.weight{expert}", {H + "experts.{expert}." + down + ".weight"}},
  };
}

ModelFamily mixtral_family() {
  ModelFamily f;
  f.name = "mixtral";
  f.presets = {{"mixtral", [](ModelConfig& m) {
                  llama_like(m);
                  m.norm_epsilon = 1e-5;
                  m.rotary_base = 1000000;
                  m.group_query_attention = true;
                  m.num_experts = 8;
                  m.moe_router_topk = 2;
                }}};
  f.hf_model_types = {"mixtral"};
  f.describes = [](const ModelConfig& m) {
    return m.num_experts > 0 && !m.multi_latent_attention && m.moe_shared_expert_intermediate_size == 0 && !m.qk_layernorm && !m.add_qkv_bias &&
           !m.moe_router_pre_softmax && m.moe_router_score_function == "softmax" && m.swiglu && m.normalization == "RMSNorm";
  };
  f.config_from_hf = mixtral_from_hf;
  f.config_to_hf = mixtral_to_hf;
  f.weights = llama_weights();
  for (auto& row : moe_expert_rows("block_sparse_moe", "w1", "w3", "w2")) f.weights.push_back(row);
  f.layer_spec = gpt_layer_spec;
  f.flops_per_token = moe_flops_per_token;
  return f;
}

ModelFamily qwen_moe_family() {
  ModelFamily f;
  f.name = "qwen_moe";
  auto qwen = [](ModelConfig& m) {
    llama_like(m);
    m.norm_epsilon = 1e-6;
    m.rotary_base = 1000000;
    m.group_query_attention = true;
  };
  f.presets = {{"qwen2_moe", [qwen](ModelConfig& m) {
                  qwen(m);
                  m.add_qkv_bias = true;
                  m.moe_router_pre_softmax = true;
                  m.moe_shared_expert_gate = true;
                }},
               {"qwen3_moe", [qwen](ModelConfig& m) {
                  qwen(m);
                  m.qk_layernorm = true;
                }}};
  f.hf_model_types = {"qwen2_moe", "qwen3_moe"};
  f.describes = [](const ModelConfig& m) {
    return m.num_experts > 0 && !m.multi_latent_attention && m.swiglu && m.normalization == "RMSNorm" && m.moe_router_score_function == "softmax" &&
           (m.qk_layernorm || m.add_qkv_bias) && (m.moe_shared_expert_intermediate_size == 0 || m.moe_shared_expert_gate);
  };
  f.config_from_hf = qwen_moe_from_hf;
  f.config_to_hf = qwen_moe_to_hf;
  f.weights = llama_weights();
  for (auto& row : moe_expert_rows("mlp", "gate_proj", "up_proj", "down_proj")) f.weights.push_back(row);
  const std::string L = "decoder.layers.{layer}.", H = "model.layers.{layer}.mlp.";
  f.weights.push_back({L + "mlp.shared_experts.linear_fc1.weight", {H + "shared_expert.gate_proj.weight", H + "shared_expert.up_proj.weight"},
                       HfTransform::GateUp});
  f.weights.push_back({L + "mlp.shared_experts.linear_fc2.weight", {H + "shared_expert.down_proj.weight"}});
  f.weights.push_back({L + "mlp.shared_experts.gate_weight", {H + "shared_expert_gate.weight"}});
  f.layer_spec = gpt_layer_spec;
  f.flops_per_token = moe_flops_per_token;
  return f;
}

}  // namespace megatron
