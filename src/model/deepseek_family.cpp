// DeepSeek-V2 (V2-Lite) and DeepSeek-V3 (Moonlight): multi-latent attention with YaRN, dense
// first layers, then MoE layers with shared experts. V2 routes by a softmax over all experts,
// top-k without renormalising; V3 by sigmoid scores, an auxiliary-loss-free expert bias steering
// the choice (HF's e_score_correction_bias), group-limited, renormalised, scaled. The weight
// table is Megatron-Bridge's mapping: every MLA weight copies one to one (both sides rotate
// interleaved pairs), kv_b_proj is linear_kv_up_proj whole.
//
// Where HF and Megatron differ, training follows Megatron: HF V2's group_limited_greedy scores a
// group by its best expert, Megatron (and so this trainer) by the sum of its top k / group_topk;
// the two choose the same groups for V2-Lite (greedy: no groups) and V3 (top-2 sums both).
// HF computes no auxiliary loss for either; set --moe-aux-loss-coeff yourself.
#include "model/deepseek_family.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/errors.h"
#include "model/llama_parts.h"
#include "model/moe_families.h"
#include "model/rope.h"

namespace megatron {
namespace {

[[noreturn]] void refuse(const std::string& path, const std::string& field, const nlohmann::json& value, const std::string& why) {
  throw UserError(path + ": " + field + " = " + value.dump() + " is not supported: " + why);
}

int required_int(const nlohmann::json& j, const std::string& path, const char* key) {
  if (!j.contains(key) || !j[key].is_number_integer()) throw UserError(path + ": needs an integer '" + key + "'");
  return j[key].get<int>();
}

// config.json's rope_parameters (transformers v5) or rope_scaling + rope_theta (earlier).
void rope_from_hf(const nlohmann::json& j, const std::string& path, ModelConfig& m) {
  const nlohmann::json rope = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"]
                              : j.contains("rope_scaling") && j["rope_scaling"].is_object()   ? j["rope_scaling"]
                                                                                              : nlohmann::json::object();
  m.rotary_base = rope.value("rope_theta", j.value("rope_theta", 10000.0));
  const std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
  if (type == "default") {
    m.rope_type = "rope";
    return;
  }
  if (type != "yarn") refuse(path, "rope type", type, "DeepSeek models take default or yarn rotary embeddings");
  if (rope.contains("attention_factor")) refuse(path, "rope attention_factor", rope["attention_factor"], "give mscale / mscale_all_dim");
  m.rope_type = "yarn";
  m.rotary_scaling_factor = rope.at("factor").get<double>();
  m.yarn_original_max_position_embeddings = rope.value("original_max_position_embeddings", m.max_position_embeddings);
  m.yarn_beta_fast = rope.value("beta_fast", 32.0);
  m.yarn_beta_slow = rope.value("beta_slow", 1.0);
  // HF scales cos/sin by get_mscale(f, mscale) / get_mscale(f, mscale_all_dim) when both are
  // given, by get_mscale(f) otherwise, and the softmax by get_mscale(f, mscale_all_dim)^2 when
  // mscale_all_dim is given; Megatron always by its mscale / mscale_all_dim. The same here:
  const double mscale = rope.value("mscale", 0.0), all_dim = rope.value("mscale_all_dim", 0.0);
  if (all_dim != 0.0 && mscale == 0.0) refuse(path, "rope mscale_all_dim", all_dim, "without mscale, HF's scaling has no Megatron form");
  m.mscale = all_dim != 0.0 ? mscale : 1.0;
  m.mscale_all_dim = all_dim;
}

ModelConfig deepseek_from_hf(const nlohmann::json& j, const std::string& path) {
  const std::string type = j.value("model_type", "");
  const bool v3 = type == "deepseek_v3";
  ModelConfig m;
  llama_like(m);
  m.num_layers = required_int(j, path, "num_hidden_layers");
  m.hidden_size = required_int(j, path, "hidden_size");
  m.ffn_hidden_size = required_int(j, path, "intermediate_size");
  m.num_attention_heads = required_int(j, path, "num_attention_heads");
  m.num_query_groups = m.num_attention_heads;
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null() &&
      j["num_key_value_heads"].get<int>() != m.num_attention_heads) {
    refuse(path, "num_key_value_heads", j["num_key_value_heads"], "multi-latent attention has a key and value per head");
  }
  m.vocab_size = required_int(j, path, "vocab_size");
  m.padded_vocab_size = m.vocab_size;
  m.max_position_embeddings = j.value("max_position_embeddings", 4096);
  m.seq_length = std::min(m.max_position_embeddings, 4096);
  m.norm_epsilon = j.value("rms_norm_eps", 1e-6);
  m.untie_embeddings_and_output_weights = !j.value("tie_word_embeddings", false);
  if (j.value("attention_bias", false)) refuse(path, "attention_bias", j["attention_bias"], "the MLA projections have no biases");
  if (j.value("mlp_bias", false)) refuse(path, "mlp_bias", j["mlp_bias"], "the MLPs have no biases");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") refuse(path, "hidden_act", j["hidden_act"], "the MLPs are SwiGLU (silu)");
  // Multi-latent attention; its latent norms are Megatron's --qk-layernorm.
  m.multi_latent_attention = true;
  m.qk_layernorm = true;
  m.q_lora_rank = j.contains("q_lora_rank") && !j["q_lora_rank"].is_null() ? j["q_lora_rank"].get<int>() : 0;
  m.kv_lora_rank = required_int(j, path, "kv_lora_rank");
  m.qk_head_dim = required_int(j, path, "qk_nope_head_dim");
  m.qk_pos_emb_head_dim = required_int(j, path, "qk_rope_head_dim");
  m.v_head_dim = required_int(j, path, "v_head_dim");
  m.kv_channels = m.qk_head_dim + m.qk_pos_emb_head_dim;
  if (v3 && !j.value("rope_interleave", true)) {
    refuse(path, "rope_interleave", j["rope_interleave"], "DeepSeek checkpoints rotate interleaved channel pairs");
  }
  rope_from_hf(j, path, m);
  // Dense layers first, then MoE layers (HF reads first_k_dense_replace only).
  m.num_experts = required_int(j, path, "n_routed_experts");
  m.moe_router_topk = required_int(j, path, "num_experts_per_tok");
  m.moe_ffn_hidden_size = required_int(j, path, "moe_intermediate_size");
  m.moe_shared_expert_intermediate_size = m.moe_ffn_hidden_size * j.value("n_shared_experts", 0);
  const int dense = j.value("first_k_dense_replace", 0);
  if (dense < 0 || dense > m.num_layers) refuse(path, "first_k_dense_replace", dense, "must be between 0 and num_hidden_layers");
  m.moe_layers.assign(size_t(m.num_layers), 1);
  for (int i = 0; i < dense; ++i) m.moe_layers[size_t(i)] = 0;
  m.moe_layer_freq = "([0]*" + std::to_string(dense) + "+[1]*" + std::to_string(m.num_layers - dense) + ")";
  const double scaling = j.value("routed_scaling_factor", 1.0);
  m.moe_router_topk_scaling_factor = scaling == 1.0 ? 0.0 : scaling;
  if (v3) {
    m.moe_router_score_function = "sigmoid";
    m.moe_router_enable_expert_bias = true;
    if (!j.value("norm_topk_prob", true)) {
      refuse(path, "norm_topk_prob", false, "Megatron renormalises the chosen sigmoid weights (DeepSeek-V3 does)");
    }
    m.moe_router_num_groups = required_int(j, path, "n_group");
    m.moe_router_group_topk = required_int(j, path, "topk_group");
    if (m.moe_router_num_groups == 1) m.moe_router_num_groups = m.moe_router_group_topk = 0;  // one group limits nothing
  } else {
    m.moe_router_pre_softmax = true;  // softmax over all experts, top-k, no renormalising
    const std::string method = j.value("topk_method", std::string("greedy"));
    if (method == "group_limited_greedy") {
      m.moe_router_num_groups = required_int(j, path, "n_group");
      m.moe_router_group_topk = required_int(j, path, "topk_group");
    } else if (method != "greedy") {
      refuse(path, "topk_method", method, "DeepSeek-V2 routes greedy or group_limited_greedy");
    }
  }
  // The MTP depths the checkpoint may carry (HF transformers drops them on load and saves none):
  // read when the run builds them (--mtp-num-layers), left unread otherwise.
  m.hf_mtp_layers = j.value("num_nextn_predict_layers", 0);
  if (j.contains("quantization_config")) {
    const nlohmann::json& q = j["quantization_config"];
    if (q.value("quant_method", "") != "fp8" || q.value("fmt", "e4m3") != "e4m3") {
      refuse(path, "quantization_config", q, "only DeepSeek's block FP8 (e4m3, weight_scale_inv) is read, dequantised");
    }
  }
  return m;
}

nlohmann::json deepseek_to_hf(const ModelConfig& m, int64_t hf_vocab, at::ScalarType dtype) {
  const bool v3 = m.moe_router_score_function == "sigmoid";
  int dense = 0;
  while (dense < m.num_layers && !m.is_moe_layer(dense)) ++dense;
  for (int i = dense; i < m.num_layers; ++i) {
    if (!m.is_moe_layer(i)) {
      throw UserError("--save-hf: HF DeepSeek models have their dense layers first (first_k_dense_replace); layer " +
                      std::to_string(i) + " is dense after an MoE layer");
    }
  }
  if (!v3 && !m.moe_router_pre_softmax) {
    throw UserError("--save-hf: HF DeepSeek-V2 routes by a softmax over all experts without renormalising: "
                    "the model needs --moe-router-pre-softmax");
  }
  nlohmann::json j = {
      {"architectures", {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"}},
      {"model_type", v3 ? "deepseek_v3" : "deepseek_v2"},
      {"hidden_size", m.hidden_size},
      {"intermediate_size", m.ffn_hidden_size},
      {"num_hidden_layers", m.num_layers},
      {"num_attention_heads", m.num_attention_heads},
      {"num_key_value_heads", m.num_attention_heads},
      {"vocab_size", hf_vocab},
      {"max_position_embeddings", m.max_position_embeddings},
      {"rms_norm_eps", m.norm_epsilon},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", !m.untie_embeddings_and_output_weights},
      {"attention_bias", false},
      {"q_lora_rank", m.q_lora_rank > 0 ? nlohmann::json(m.q_lora_rank) : nlohmann::json()},
      {"kv_lora_rank", m.kv_lora_rank},
      {"qk_nope_head_dim", m.qk_head_dim},
      {"qk_rope_head_dim", m.qk_pos_emb_head_dim},
      {"v_head_dim", m.v_head_dim},
      {"n_routed_experts", m.num_experts},
      {"num_experts_per_tok", m.moe_router_topk},
      {"moe_intermediate_size", m.expert_ffn_hidden_size()},
      {"n_shared_experts", m.moe_shared_expert_intermediate_size / std::max(1, m.expert_ffn_hidden_size())},
      {"first_k_dense_replace", dense},
      {"routed_scaling_factor", m.moe_router_topk_scaling_factor > 0 ? m.moe_router_topk_scaling_factor : 1.0},
      {"rope_theta", m.rotary_base},
      {"torch_dtype", dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32"}};
  if (uses_yarn(m) && m.rotary_scaling_factor != 1.0) {
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", m.rotary_scaling_factor},
                         {"original_max_position_embeddings", m.yarn_original_max_position_embeddings},
                         {"beta_fast", m.yarn_beta_fast},
                         {"beta_slow", m.yarn_beta_slow},
                         {"mscale", m.mscale},
                         {"mscale_all_dim", m.mscale_all_dim}};
  }
  if (v3) {
    j["n_group"] = m.moe_router_num_groups > 0 ? m.moe_router_num_groups : 1;
    j["topk_group"] = m.moe_router_group_topk > 0 ? m.moe_router_group_topk : 1;
    j["norm_topk_prob"] = true;
    j["rope_interleave"] = true;
    j["num_nextn_predict_layers"] = m.mtp_num_layers;
  } else {
    j["topk_method"] = m.moe_router_num_groups > 0 ? "group_limited_greedy" : "greedy";
    if (m.moe_router_num_groups > 0) {
      j["n_group"] = m.moe_router_num_groups;
      j["topk_group"] = m.moe_router_group_topk;
    }
    j["norm_topk_prob"] = false;
  }
  return j;
}

std::vector<HfWeightRule> deepseek_weights() {
  const std::string L = "decoder.layers.{layer}.", H = "model.layers.{layer}.", A = H + "self_attn.";
  std::vector<HfWeightRule> rows = {
      {"embedding.word_embeddings.weight", {"model.embed_tokens.weight"}, HfTransform::VocabRows},
      {L + "input_layernorm.weight", {H + "input_layernorm.weight"}},
      {L + "self_attention.linear_q_proj.weight", {A + "q_proj.weight"}},
      {L + "self_attention.linear_q_down_proj.weight", {A + "q_a_proj.weight"}},
      {L + "self_attention.linear_q_up_proj.layer_norm_weight", {A + "q_a_layernorm.weight"}},
      {L + "self_attention.linear_q_up_proj.weight", {A + "q_b_proj.weight"}},
      {L + "self_attention.linear_kv_down_proj.weight", {A + "kv_a_proj_with_mqa.weight"}},
      {L + "self_attention.linear_kv_up_proj.layer_norm_weight", {A + "kv_a_layernorm.weight"}},
      {L + "self_attention.linear_kv_up_proj.weight", {A + "kv_b_proj.weight"}},
      {L + "self_attention.linear_proj.weight", {A + "o_proj.weight"}},
      // Dense layers: the norm fused into linear_fc1 (Megatron's TE spec).
      {L + "mlp.linear_fc1.layer_norm_weight", {H + "post_attention_layernorm.weight"}},
      {L + "mlp.linear_fc1.weight", {H + "mlp.gate_proj.weight", H + "mlp.up_proj.weight"}, HfTransform::GateUp},
      {L + "mlp.linear_fc2.weight", {H + "mlp.down_proj.weight"}},
      {L + "mlp.router.expert_bias", {H + "mlp.gate.e_score_correction_bias"}},
      {L + "mlp.shared_experts.linear_fc1.weight",
       {H + "mlp.shared_experts.gate_proj.weight", H + "mlp.shared_experts.up_proj.weight"}, HfTransform::GateUp},
      {L + "mlp.shared_experts.linear_fc2.weight", {H + "mlp.shared_experts.down_proj.weight"}},
      {"decoder.final_layernorm.weight", {"model.norm.weight"}},
      {"output_layer.weight", {"lm_head.weight"}, HfTransform::VocabRows, "model.embed_tokens.weight"},
  };
  for (auto& row : moe_expert_rows("mlp", "gate_proj", "up_proj", "down_proj")) rows.push_back(row);
  // Multi-token prediction depth k is HF's layer num_layers + k (DeepSeek-V3's model.layers.61):
  // its decoder layer under the same names, and its own norms and projection.
  const std::string decoder = "decoder.layers.{layer}.", hf_layer = "model.layers.{layer}.";
  const std::string mtp = "mtp.layers.{mtp}.", hf_mtp = "model.layers.{mtp_layer}.";
  std::vector<HfWeightRule> depth;
  for (const HfWeightRule& row : rows) {
    if (row.megatron.rfind(decoder, 0) != 0) continue;
    HfWeightRule copy = row;
    copy.megatron = mtp + "transformer_layer." + row.megatron.substr(decoder.size());
    for (auto& name : copy.hf) name = hf_mtp + name.substr(hf_layer.size());
    depth.push_back(copy);
  }
  depth.push_back({mtp + "enorm.weight", {hf_mtp + "enorm.weight"}});
  depth.push_back({mtp + "hnorm.weight", {hf_mtp + "hnorm.weight"}});
  depth.push_back({mtp + "eh_proj.weight", {hf_mtp + "eh_proj.weight"}});
  depth.push_back({mtp + "final_layernorm.weight", {hf_mtp + "shared_head.norm.weight"}});
  rows.insert(rows.end(), depth.begin(), depth.end());
  return rows;
}

}  // namespace

ModelFamily deepseek_family() {
  ModelFamily f;
  f.name = "deepseek";
  auto deepseek = [](ModelConfig& m) {
    llama_like(m);
    m.norm_epsilon = 1e-6;
    m.rotary_base = 10000;
    m.multi_latent_attention = true;
    m.qk_layernorm = true;
    m.rope_type = "yarn";
  };
  f.presets = {{"deepseek_v2", [deepseek](ModelConfig& m) {
                  deepseek(m);
                  m.moe_router_pre_softmax = true;
                }},
               {"deepseek_v3", [deepseek](ModelConfig& m) {
                  deepseek(m);
                  m.moe_router_score_function = "sigmoid";
                  m.moe_router_enable_expert_bias = true;
                }}};
  f.hf_model_types = {"deepseek_v2", "deepseek_v3"};
  f.describes = [](const ModelConfig& m) { return m.multi_latent_attention; };
  f.config_from_hf = deepseek_from_hf;
  f.config_to_hf = deepseek_to_hf;
  f.weights = deepseek_weights();
  f.layer_spec = gpt_layer_spec;
  f.flops_per_token = moe_flops_per_token;
  return f;
}

}  // namespace megatron
