#include "checkpoint/hf_config_check.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <c10/util/StringUtil.h>

#include "core/config_json.h"
#include "core/errors.h"

namespace megatron {
namespace {

// The rules' vocabulary is shared with the checkpoint's own keys (core/config_json.h).
using Kind = FieldKind;
using Field = FieldRule;

// The fields of config.json the Llama, Qwen, Mistral, Mixtral, Qwen-MoE and DeepSeek readers take.
const Field kTopLevel[] = {
    {"model_type", Kind::String},
    {"num_hidden_layers", Kind::Count},
    {"hidden_size", Kind::Count},
    {"intermediate_size", Kind::Count},
    {"num_attention_heads", Kind::Count},
    {"num_key_value_heads", Kind::CountOrNull},
    {"head_dim", Kind::CountOrNull},
    {"vocab_size", Kind::Count},
    {"max_position_embeddings", Kind::Count},
    {"rms_norm_eps", Kind::Positive},
    {"rope_theta", Kind::Positive},
    {"rope_scaling", Kind::ObjectOrNull},
    {"rope_parameters", Kind::ObjectOrNull},
    {"tie_word_embeddings", Kind::Bool},
    {"attention_bias", Kind::Bool},
    {"mlp_bias", Kind::Bool},
    {"hidden_act", Kind::String},
    {"use_sliding_window", Kind::Bool},
    {"sliding_window", Kind::CountOrNull, 0},
    {"router_jitter_noise", Kind::NonNegative},
    {"num_experts", Kind::Count},
    {"num_local_experts", Kind::Count},
    {"num_experts_per_tok", Kind::Count},
    {"moe_intermediate_size", Kind::Count},
    {"shared_expert_intermediate_size", Kind::Count, 0},
    {"norm_topk_prob", Kind::Bool},
    {"decoder_sparse_step", Kind::Count},
    {"mlp_only_layers", Kind::CountList},
    {"q_lora_rank", Kind::CountOrNull, 0},
    {"kv_lora_rank", Kind::Count},
    {"qk_nope_head_dim", Kind::Count},
    {"qk_rope_head_dim", Kind::Count},
    {"v_head_dim", Kind::Count},
    {"n_routed_experts", Kind::Count},
    {"n_shared_experts", Kind::CountOrNull, 0},
    {"first_k_dense_replace", Kind::Count, 0},
    {"routed_scaling_factor", Kind::Positive},
    {"n_group", Kind::CountOrNull},
    {"topk_group", Kind::CountOrNull},
    {"topk_method", Kind::String},
    {"rope_interleave", Kind::Bool},
    {"num_nextn_predict_layers", Kind::Count, 0},
    {"quantization_config", Kind::ObjectOrNull},
};

// rope_scaling / rope_parameters.
const Field kRope[] = {
    {"rope_type", Kind::String},
    {"type", Kind::String},
    {"rope_theta", Kind::Positive},
    {"factor", Kind::Positive},
    {"low_freq_factor", Kind::Positive},
    {"high_freq_factor", Kind::Positive},
    {"original_max_position_embeddings", Kind::Count},
    {"beta_fast", Kind::Finite},
    {"beta_slow", Kind::Finite},
    {"mscale", Kind::NonNegative},
    {"mscale_all_dim", Kind::NonNegative},
    {"attention_factor", Kind::Positive},
};


bool is_count(const nlohmann::json& v, int64_t least) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned()) {  // how the parser keeps every integer from 0 up
      const uint64_t n = v.get<uint64_t>();
      return n >= uint64_t(least) && n <= uint64_t(std::numeric_limits<int32_t>::max());
    }
    const int64_t n = v.get<int64_t>();
    return n >= least && n <= std::numeric_limits<int32_t>::max();
  }
  if (!v.is_number_float()) return false;  // 4096.0 is read as 4096, as Python's int() would
  const double d = v.get<double>();
  return std::isfinite(d) && d == std::floor(d) && d >= double(least) && d <= double(std::numeric_limits<int32_t>::max());
}

std::string wanted(const Field& f) {
  const std::string count = "an integer from " + std::to_string(f.least) + " to 2147483647";
  switch (f.kind) {
    case Kind::Count: return count;
    case Kind::CountOrNull: return count + ", or null";
    case Kind::Positive: return "a finite number above 0";
    case Kind::NonNegative: return "a finite number, 0 or more";
    case Kind::Finite: return "a finite number";
    case Kind::Bool: return "true or false";
    case Kind::String: return "a string";
    case Kind::ObjectOrNull: return "an object, or null";
    case Kind::CountList: return "a list of integers from 0";
    case Kind::StringList: return "a non-empty list of strings";
  }
  return "";
}

bool fits(const Field& f, const nlohmann::json& v) {
  switch (f.kind) {
    case Kind::Count: return is_count(v, f.least);
    case Kind::CountOrNull: return v.is_null() || is_count(v, f.least);
    case Kind::Positive: return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0;
    case Kind::NonNegative: return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0;
    case Kind::Finite: return v.is_number() && std::isfinite(v.get<double>());
    case Kind::Bool: return v.is_boolean();
    case Kind::String: return v.is_string();
    case Kind::ObjectOrNull: return v.is_object() || v.is_null();
    case Kind::CountList: {
      if (!v.is_array()) return false;
      for (const auto& e : v) {
        if (!is_count(e, 0)) return false;
      }
      return true;
    }
    case Kind::StringList: {
      if (!v.is_array() || v.empty()) return false;
      for (const auto& e : v) {
        if (!e.is_string()) return false;
      }
      return true;
    }
  }
  return false;
}

template <typename Fields>
void check_fields(const nlohmann::json& j, const Fields& fields, const std::string& path, const std::string& prefix) {
  for (const Field& f : fields) {
    if (!j.contains(f.key) || fits(f, j[f.key])) continue;
    throw UserError(path + ": " + prefix + f.key + " must be " + wanted(f) + ", got " + j[f.key].dump());
  }
}

}  // namespace

void check_hf_config_fields(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) throw UserError(path + ": expected a JSON object of model settings, got " + std::string(j.type_name()));
  check_fields(j, kTopLevel, path, "");
  for (const char* rope : {"rope_scaling", "rope_parameters"}) {
    if (j.contains(rope) && j[rope].is_object()) check_fields(j[rope], kRope, path, std::string(rope) + ".");
  }
}

void check_saved_model_fields(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) throw UserError(path + ": \"model_config\" must be an object of model settings, got " + std::string(j.type_name()));
  // The keys checkpoints write (core/config_json.cpp), each with its rule there.
  static const std::vector<FieldRule> saved = model_config_rules();
  check_fields(j, saved, path, "model_config.");
}

void check_saved_model(const ModelConfig& m, const std::string& path) {
  auto refuse = [&](const std::string& why) { throw UserError(path + ": model_config: " + why); };
  if (m.normalization != "LayerNorm" && m.normalization != "RMSNorm") refuse("normalization must be LayerNorm or RMSNorm");
  if (m.position_embedding_type != "learned_absolute" && m.position_embedding_type != "rope" && m.position_embedding_type != "none") {
    refuse("position_embedding_type must be learned_absolute, rope or none");
  }
  if (m.padded_vocab_size < m.vocab_size) refuse("padded_vocab_size is below vocab_size");
  if (m.num_experts > 0 && m.moe_layers.size() != size_t(m.num_layers)) refuse("moe_layers must hold one entry per layer");
  // Layers beyond any model trained (the largest have ~128): each becomes modules and files.
  if (m.num_layers > 4096 || m.mtp_num_layers > 64) refuse("num_layers above 4096 or mtp_num_layers above 64");
  if (m.multi_latent_attention && (m.kv_lora_rank < 1 || m.qk_head_dim < 1 || m.v_head_dim < 1)) {
    refuse("multi-latent attention needs kv_lora_rank, qk_head_dim and v_head_dim of at least 1");
  }
  if (m.num_experts > 0 && m.moe_ffn_hidden_size < 1) refuse("moe_ffn_hidden_size must be at least 1 with experts");
  check_hf_model_sizes(m, path);
}

void check_hf_model_sizes(const ModelConfig& m, const std::string& path) {
  auto refuse = [&](const std::string& why) { throw UserError(path + ": " + why); };
  if (m.num_attention_heads < 1) refuse("num_attention_heads must be at least 1");
  if (m.num_query_groups < 1 || m.num_attention_heads % m.num_query_groups != 0) {
    refuse("num_attention_heads (" + std::to_string(m.num_attention_heads) + ") must be a multiple of num_key_value_heads (" +
           std::to_string(m.num_query_groups) + ")");
  }
  if (m.kv_channels < 1) {
    refuse("the head size is 0: hidden_size (" + std::to_string(m.hidden_size) + ") is less than num_attention_heads (" +
           std::to_string(m.num_attention_heads) + ") and no head_dim is given");
  }
  if (m.num_experts > 0 && (m.moe_router_topk < 1 || m.moe_router_topk > m.num_experts)) {
    refuse("num_experts_per_tok (" + std::to_string(m.moe_router_topk) + ") must be from 1 to the number of experts (" +
           std::to_string(m.num_experts) + ")");
  }
  if (m.moe_router_num_groups > 0 &&
      (m.num_experts % m.moe_router_num_groups != 0 || m.moe_router_group_topk < 1 || m.moe_router_group_topk > m.moe_router_num_groups)) {
    refuse("n_group (" + std::to_string(m.moe_router_num_groups) + ") must divide the experts (" + std::to_string(m.num_experts) +
           ") and topk_group (" + std::to_string(m.moe_router_group_topk) + ") be from 1 to n_group");
  }
  // Rows and columns of the largest weights (in double: the products of 32-bit fields overflow
  // 64 bits): the fused attention projection, the gated MLP, the embedding. Beyond 2^40
  // elements no tensor fits any machine; refusing here keeps every size product downstream
  // within its type.
  const double heads_rows = (double(m.num_attention_heads) + 2.0 * m.num_query_groups) * m.kv_channels;
  const std::pair<double, const char*> biggest[] = {
      {heads_rows * m.hidden_size, "the attention projection ((num_attention_heads + 2 x num_key_value_heads) x head_dim x hidden_size)"},
      {2.0 * m.ffn_hidden_size * m.hidden_size, "the MLP (2 x intermediate_size x hidden_size)"},
      {double(m.vocab_size) * m.hidden_size, "the embedding (vocab_size x hidden_size)"}};
  for (const auto& [elements, what] : biggest) {
    if (elements > std::ldexp(1.0, 40)) refuse(std::string(what) + " has " + c10::str(elements) + " elements, more than any machine holds");
  }
}

}  // namespace megatron
