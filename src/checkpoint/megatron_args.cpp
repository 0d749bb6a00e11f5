#include "checkpoint/megatron_args.h"

#include <vector>

#include "core/errors.h"
#include "moe/moe_config.h"

namespace megatron {
namespace {

using pickle::Value;

// The run's arguments by name, None read as absent.
class Args {
 public:
  Args(const Value& args, const std::string& what) : args_(args), what_(what) {}

  const Value* get(const char* name) const {
    const Value* v = args_.get(name);
    return v == nullptr || v->kind == Value::Kind::None ? nullptr : v;
  }
  int64_t integer(const char* name, int64_t fallback) const { return megatron_int_arg(&args_, name, fallback, what_); }
  double number(const char* name, double fallback) const {
    const Value* v = get(name);
    if (v == nullptr) return fallback;
    if (v->kind != Value::Kind::Int && v->kind != Value::Kind::Float && v->kind != Value::Kind::Bool) bad(name, "a number", *v);
    return v->as_number();
  }
  bool flag(const char* name, bool fallback) const { return integer(name, fallback ? 1 : 0) != 0; }
  std::string text(const char* name, const std::string& fallback) const {
    const Value* v = get(name);
    if (v == nullptr) return fallback;
    if (v->kind != Value::Kind::String) bad(name, "a string", *v);
    return v->text;
  }
  // A value Megatron-LM's parser gives as one item or a list of them (nargs='+').
  std::vector<const Value*> items(const char* name) const {
    const Value* v = get(name);
    if (v == nullptr) return {};
    if (v->kind != Value::Kind::List && v->kind != Value::Kind::Tuple) return {v};
    std::vector<const Value*> out;
    for (const auto& item : v->items) out.push_back(item.get());
    return out;
  }
  [[noreturn]] void bad(const char* name, const std::string& expected, const Value& found) const {
    throw UserError(what_ + ": the checkpoint's args hold '" + name + "' as " + found.describe() + ", expected " + expected);
  }
  const std::string& what() const { return what_; }

 private:
  const Value& args_;
  const std::string& what_;
};

// --moe-layer-freq as Megatron-LM parses it (moe_freq_type): an int N (every N-th layer) or the
// list an expression like "([0]*1+[1]*47)" evaluates to; here in the form --moe-layer-freq takes.
std::string moe_layer_freq(const Args& args) {
  const Value* v = args.get("moe_layer_freq");
  if (v == nullptr) return "1";
  if (v->kind == Value::Kind::Int) return std::to_string(v->integer);
  if (v->kind != Value::Kind::List) args.bad("moe_layer_freq", "an int or a list of 0/1 per layer", *v);
  std::string out = "[";
  for (size_t i = 0; i < v->items.size(); ++i) {
    if (v->items[i]->kind != Value::Kind::Int) args.bad("moe_layer_freq", "a list of ints", *v->items[i]);
    out += (i ? "," : "") + std::to_string(v->items[i]->integer);
  }
  return out + "]";
}

void read_moe(const Args& args, ModelConfig& m) {
  m.num_experts = int(args.integer("num_experts", 0));
  if (m.num_experts == 0) return;
  try {
    m.moe_layer_freq = moe_layer_freq(args);
    m.moe_layers = moe::parse_moe_layer_freq(m.moe_layer_freq, m.num_layers);
  } catch (const UserError& e) {  // named as the flag: say where it came from
    throw UserError(args.what() + ": the checkpoint's args: " + e.what());
  }
  m.moe_ffn_hidden_size = int(args.integer("moe_ffn_hidden_size", m.ffn_hidden_size));
  m.moe_router_topk = int(args.integer("moe_router_topk", 2));
  m.moe_router_score_function = args.text("moe_router_score_function", "softmax");
  m.moe_router_pre_softmax = args.flag("moe_router_pre_softmax", false);
  m.moe_router_topk_scaling_factor = args.number("moe_router_topk_scaling_factor", 0.0);
  m.moe_router_num_groups = int(args.integer("moe_router_num_groups", 0));
  m.moe_router_group_topk = int(args.integer("moe_router_group_topk", 0));
  m.moe_router_enable_expert_bias = args.flag("moe_router_enable_expert_bias", false);
  m.moe_router_bias_update_rate = args.number("moe_router_bias_update_rate", 1e-3);
  m.moe_router_dtype = args.text("moe_router_dtype", "");
  m.moe_z_loss_coeff = args.number("moe_z_loss_coeff", 0.0);
  m.moe_expert_capacity_factor = args.number("moe_expert_capacity_factor", 0.0);
  m.moe_token_drop_policy = args.text("moe_token_drop_policy", "probs");
  m.moe_pad_expert_input_to_capacity = args.flag("moe_pad_expert_input_to_capacity", false);
  m.moe_shared_expert_intermediate_size = int(args.integer("moe_shared_expert_intermediate_size", 0));
  m.moe_shared_expert_gate = args.flag("moe_shared_expert_gate", false);
  // One balancing type or several (newer Megatron-LM), each with its coefficient.
  const auto types = args.items("moe_router_load_balancing_type");
  const auto coeffs = args.items("moe_aux_loss_coeff");
  if (!types.empty()) {
    m.moe_router_load_balancing_type.clear();
    for (const Value* t : types) {
      if (t->kind != Value::Kind::String) args.bad("moe_router_load_balancing_type", "strings", *t);
      m.moe_router_load_balancing_type.push_back(t->text);
    }
  }
  m.moe_aux_loss_coeff.assign(m.moe_router_load_balancing_type.size(), 0.0);
  if (coeffs.size() == 1) {
    if (coeffs[0]->kind != Value::Kind::Int && coeffs[0]->kind != Value::Kind::Float) args.bad("moe_aux_loss_coeff", "a number", *coeffs[0]);
    m.moe_aux_loss_coeff.assign(m.moe_router_load_balancing_type.size(), coeffs[0]->as_number());
  } else if (!coeffs.empty()) {
    if (coeffs.size() != m.moe_router_load_balancing_type.size()) {
      throw UserError(args.what() + ": the checkpoint's args give " + std::to_string(coeffs.size()) + " moe_aux_loss_coeff values for " +
                      std::to_string(m.moe_router_load_balancing_type.size()) + " moe_router_load_balancing_type entries");
    }
    for (size_t i = 0; i < coeffs.size(); ++i) {
      if (coeffs[i]->kind != Value::Kind::Int && coeffs[i]->kind != Value::Kind::Float) args.bad("moe_aux_loss_coeff", "numbers", *coeffs[i]);
      m.moe_aux_loss_coeff[i] = coeffs[i]->as_number();
    }
  }
}

// DeepSeek's multi-latent attention (its latents' norms are --qk-layernorm's) and the YaRN rotary
// embedding it takes when --rope-type is unset. YaRN's original context and betas have no
// Megatron-LM flag: MLATransformerConfig's defaults, unless the args carry them.
void read_mla(const Args& args, ModelConfig& m) {
  m.multi_latent_attention = args.flag("multi_latent_attention", false);
  m.rope_type = args.text("rope_type", "");
  m.rotary_scaling_factor = args.number("rotary_scaling_factor", 1.0);
  m.mscale = args.number("mscale", 1.0);
  m.mscale_all_dim = args.number("mscale_all_dim", 0.0);
  m.yarn_original_max_position_embeddings =
      int(args.integer("original_max_position_embeddings", args.integer("yarn_original_max_position_embeddings", 4096)));
  m.yarn_beta_fast = args.number("beta_fast", args.number("yarn_beta_fast", 32.0));
  m.yarn_beta_slow = args.number("beta_slow", args.number("yarn_beta_slow", 1.0));
  if (!m.multi_latent_attention) return;
  m.group_query_attention = false;  // every head has its own keys, up-projected from the shared latent
  m.num_query_groups = m.num_attention_heads;
  m.q_lora_rank = int(args.integer("q_lora_rank", 0));
  m.kv_lora_rank = int(args.integer("kv_lora_rank", 512));
  m.qk_head_dim = int(args.integer("qk_head_dim", 128));
  m.qk_pos_emb_head_dim = int(args.integer("qk_pos_emb_head_dim", 64));
  m.v_head_dim = int(args.integer("v_head_dim", 128));
}

}  // namespace

ModelConfig model_config_from_megatron_args(const pickle::Value& value, const std::string& what) {
  const Args args(value, what);
  ModelConfig m;
  for (const char* required : {"num_layers", "hidden_size", "num_attention_heads", "padded_vocab_size"}) {
    if (args.get(required) == nullptr) throw UserError(what + ": the checkpoint's args lack '" + std::string(required) + "'");
  }
  m.num_layers = int(args.integer("num_layers", 0));
  m.hidden_size = int(args.integer("hidden_size", 0));
  m.num_attention_heads = int(args.integer("num_attention_heads", 0));
  m.ffn_hidden_size = int(args.integer("ffn_hidden_size", 4 * m.hidden_size));
  m.group_query_attention = args.flag("group_query_attention", false);
  m.num_query_groups = m.group_query_attention ? int(args.integer("num_query_groups", m.num_attention_heads)) : m.num_attention_heads;
  m.kv_channels = int(args.integer("kv_channels", m.hidden_size / m.num_attention_heads));
  m.seq_length = int(args.integer("seq_length", 2048));
  m.max_position_embeddings = int(args.integer("max_position_embeddings", m.seq_length));
  m.padded_vocab_size = int(args.integer("padded_vocab_size", 0));
  m.vocab_size = m.padded_vocab_size;
  m.padded_vocab_size_flag = m.padded_vocab_size;
  m.make_vocab_size_divisible_by = int(args.integer("make_vocab_size_divisible_by", 128));
  m.normalization = args.text("normalization", "LayerNorm");
  m.norm_epsilon = args.number("norm_epsilon", args.number("layernorm_epsilon", 1e-5));
  m.layernorm_zero_centered_gamma = args.flag("apply_layernorm_1p", false);
  m.swiglu = args.flag("swiglu", false);
  m.add_bias_linear = args.flag("add_bias_linear", true);
  m.add_qkv_bias = args.flag("add_qkv_bias", false);
  m.qk_layernorm = args.flag("qk_layernorm", false);
  m.untie_embeddings_and_output_weights = args.flag("untie_embeddings_and_output_weights", false);
  m.position_embedding_type = args.text("position_embedding_type", "learned_absolute");
  m.rotary_base = args.number("rotary_base", 10000.0);
  m.rotary_percent = args.number("rotary_percent", 1.0);
  m.rotary_seq_len_interpolation_factor = args.number("rotary_seq_len_interpolation_factor", 1.0);
  m.use_rope_scaling = args.flag("use_rope_scaling", false);
  m.rope_scaling_factor = args.number("rope_scaling_factor", 8.0);
  m.init_method_std = args.number("init_method_std", 0.02);
  m.hidden_dropout = args.number("hidden_dropout", 0.1);
  m.attention_dropout = args.number("attention_dropout", 0.1);
  m.mtp_num_layers = int(args.integer("mtp_num_layers", 0));
  m.mtp_loss_scaling_factor = args.number("mtp_loss_scaling_factor", 0.1);
  read_mla(args, m);
  read_moe(args, m);
  return m;
}

int64_t megatron_int_arg(const pickle::Value* args, const char* name, int64_t fallback, const std::string& what) {
  const Value* v = args != nullptr ? args->get(name) : nullptr;
  if (v == nullptr || v->kind == Value::Kind::None) return fallback;
  if (v->kind != Value::Kind::Int && v->kind != Value::Kind::Bool) {
    throw UserError(what + ": the checkpoint's args hold '" + name + "' as " + v->describe() + ", expected an int");
  }
  return v->as_int();
}

}  // namespace megatron
