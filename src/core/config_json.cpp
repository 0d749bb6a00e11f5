#include "core/config_json.h"

#include <nlohmann/json.hpp>

#include <type_traits>

#include "core/errors.h"

namespace megatron {
namespace {

constexpr FieldKind Count = FieldKind::Count, Positive = FieldKind::Positive, NonNegative = FieldKind::NonNegative,
                    Finite = FieldKind::Finite, Bool = FieldKind::Bool, String = FieldKind::String, CountList = FieldKind::CountList,
                    StringList = FieldKind::StringList;

// One list of (rule, member) pairs drives writing, reading and checking, so they cannot drift apart.
template <typename Visit>
void visit_model(ModelConfig& m, Visit&& v) {
  v({"num_layers", Count}, m.num_layers);
  v({"hidden_size", Count}, m.hidden_size);
  v({"ffn_hidden_size", Count}, m.ffn_hidden_size);
  v({"num_attention_heads", Count}, m.num_attention_heads);
  v({"group_query_attention", Bool}, m.group_query_attention);
  v({"num_query_groups", Count}, m.num_query_groups);
  v({"kv_channels", Count}, m.kv_channels);
  v({"seq_length", Count}, m.seq_length);
  v({"max_position_embeddings", Count}, m.max_position_embeddings);
  v({"vocab_size", Count}, m.vocab_size);
  v({"make_vocab_size_divisible_by", Count}, m.make_vocab_size_divisible_by);
  v({"padded_vocab_size", Count}, m.padded_vocab_size);
  v({"hf_vocab_size", Count, 0}, m.hf_vocab_size);
  v({"normalization", String}, m.normalization);
  v({"norm_epsilon", Positive}, m.norm_epsilon);
  v({"swiglu", Bool}, m.swiglu);
  v({"add_bias_linear", Bool}, m.add_bias_linear);
  v({"add_qkv_bias", Bool}, m.add_qkv_bias);
  v({"qk_layernorm", Bool}, m.qk_layernorm);
  v({"position_embedding_type", String}, m.position_embedding_type);
  v({"rotary_base", Positive}, m.rotary_base);
  v({"rotary_percent", Positive}, m.rotary_percent);
  v({"use_rope_scaling", Bool}, m.use_rope_scaling);
  v({"rope_scaling_factor", Positive}, m.rope_scaling_factor);
  v({"rope_low_freq_factor", Positive}, m.rope_low_freq_factor);
  v({"rope_high_freq_factor", Positive}, m.rope_high_freq_factor);
  v({"rope_original_max_position_embeddings", Count}, m.rope_original_max_position_embeddings);
  v({"untie_embeddings_and_output_weights", Bool}, m.untie_embeddings_and_output_weights);
  v({"init_method_std", NonNegative}, m.init_method_std);
  v({"hidden_dropout", NonNegative}, m.hidden_dropout);
  v({"attention_dropout", NonNegative}, m.attention_dropout);
}

// Written by checkpoints since mixture-of-experts; a checkpoint without them is dense.
template <typename Visit>
void visit_moe(ModelConfig& m, Visit&& v) {
  v({"num_experts", Count, 0}, m.num_experts);
  v({"moe_ffn_hidden_size", Count, 0}, m.moe_ffn_hidden_size);
  v({"moe_layers", CountList}, m.moe_layers);
  v({"moe_router_topk", Count, 0}, m.moe_router_topk);
  v({"moe_router_pre_softmax", Bool}, m.moe_router_pre_softmax);
  v({"moe_router_score_function", String}, m.moe_router_score_function);
  v({"moe_router_topk_scaling_factor", NonNegative}, m.moe_router_topk_scaling_factor);
  v({"moe_shared_expert_intermediate_size", Count, 0}, m.moe_shared_expert_intermediate_size);
  v({"moe_shared_expert_gate", Bool}, m.moe_shared_expert_gate);
  // sinkhorn routes otherwise at inference too (generate, convert); older checkpoints: top-k.
  v({"moe_router_load_balancing_type", StringList}, m.moe_router_load_balancing_type);
}

// Written by checkpoints since multi-latent attention and DeepSeek routing; older ones lack them
// (and the defaults hold).
template <typename Visit>
void visit_deepseek(ModelConfig& m, Visit&& v) {
  v({"multi_latent_attention", Bool}, m.multi_latent_attention);
  v({"q_lora_rank", Count, 0}, m.q_lora_rank);
  v({"kv_lora_rank", Count, 0}, m.kv_lora_rank);
  v({"qk_head_dim", Count, 0}, m.qk_head_dim);
  v({"qk_pos_emb_head_dim", Count, 0}, m.qk_pos_emb_head_dim);
  v({"v_head_dim", Count, 0}, m.v_head_dim);
  v({"rope_type", String}, m.rope_type);
  v({"rotary_scaling_factor", Positive}, m.rotary_scaling_factor);
  v({"mscale", NonNegative}, m.mscale);
  v({"mscale_all_dim", NonNegative}, m.mscale_all_dim);
  v({"yarn_original_max_position_embeddings", Count}, m.yarn_original_max_position_embeddings);
  v({"yarn_beta_fast", Finite}, m.yarn_beta_fast);
  v({"yarn_beta_slow", Finite}, m.yarn_beta_slow);
  v({"moe_router_enable_expert_bias", Bool}, m.moe_router_enable_expert_bias);
  v({"moe_router_num_groups", Count, 0}, m.moe_router_num_groups);
  v({"moe_router_group_topk", Count, 0}, m.moe_router_group_topk);
  v({"mtp_num_layers", Count, 0}, m.mtp_num_layers);
  v({"mtp_loss_scaling_factor", NonNegative}, m.mtp_loss_scaling_factor);
}

// Written since Megatron's launch-script flags (--apply-layernorm-1p,
// --rotary-seq-len-interpolation-factor); older checkpoints lack them (and the defaults hold).
template <typename Visit>
void visit_launch_flags(ModelConfig& m, Visit&& v) {
  v({"layernorm_zero_centered_gamma", Bool}, m.layernorm_zero_centered_gamma);
  v({"rotary_seq_len_interpolation_factor", Positive}, m.rotary_seq_len_interpolation_factor);
}

template <typename Visit>
void visit_tokenizer(DataConfig& d, Visit&& v) {
  v("tokenizer_type", d.tokenizer_type);
  v("tokenizer_model", d.tokenizer_model);
  v("vocab_file", d.vocab_file);
  v("merge_file", d.merge_file);
  v("eod_id", d.eod_id);
}

// TikTokenizer's options, written since it exists; older checkpoints lack them (defaults hold).
template <typename Visit>
void visit_tiktoken(DataConfig& d, Visit&& v) {
  v("tiktoken_pattern", d.tiktoken_pattern);
  v("tiktoken_num_special_tokens", d.tiktoken_num_special_tokens);
  v("tokenizer_special_tokens", d.tokenizer_special_tokens);
}

template <typename T>
void read_key(const nlohmann::json& j, const char* key, T& into) {
  if (!j.contains(key)) throw UserError(std::string("checkpoint config lacks '") + key + "'");
  into = j.at(key).get<T>();
}

}  // namespace

nlohmann::json model_config_to_json(const ModelConfig& model) {
  ModelConfig m = model;
  nlohmann::json j;
  auto write = [&](const FieldRule& f, auto& value) { j[f.key] = value; };
  visit_model(m, write);
  visit_moe(m, write);
  visit_deepseek(m, write);
  visit_launch_flags(m, write);
  return j;
}

std::vector<FieldRule> model_config_rules() {
  ModelConfig m;
  std::vector<FieldRule> rules;
  auto collect = [&](const FieldRule& f, auto&) { rules.push_back(f); };
  visit_model(m, collect);
  visit_moe(m, collect);
  visit_deepseek(m, collect);
  visit_launch_flags(m, collect);
  return rules;
}

ModelConfig model_config_from_json(const nlohmann::json& j) {
  ModelConfig m;
  visit_model(m, [&](const FieldRule& f, auto& value) { read_key(j, f.key, value); });
  auto optional = [&](const FieldRule& f, auto& value) {
    if (j.contains(f.key)) value = j.at(f.key).get<std::remove_reference_t<decltype(value)>>();
  };
  visit_moe(m, optional);
  visit_deepseek(m, optional);
  visit_launch_flags(m, optional);
  return m;
}

nlohmann::json tokenizer_config_to_json(const DataConfig& data) {
  DataConfig d = data;
  nlohmann::json j;
  visit_tokenizer(d, [&](const char* key, auto& value) { j[key] = value; });
  if (d.tokenizer_type == "TikTokenizer") visit_tiktoken(d, [&](const char* key, auto& value) { j[key] = value; });
  return j;
}

void tokenizer_config_from_json(const nlohmann::json& j, DataConfig& data) {
  visit_tokenizer(data, [&](const char* key, auto& value) { read_key(j, key, value); });
  visit_tiktoken(data, [&](const char* key, auto& value) {
    if (j.contains(key)) value = j.at(key).get<std::remove_reference_t<decltype(value)>>();
  });
}

}  // namespace megatron
