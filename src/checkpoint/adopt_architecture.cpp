// A model's architecture from a saved model instead of the flags; see adopt_architecture.h.
#include "checkpoint/adopt_architecture.h"

#include <c10/util/StringUtil.h>
#include <nlohmann/json.hpp>

#include <type_traits>

#include "checkpoint/checkpoint.h"
#include "core/config_json.h"
#include "core/errors.h"

namespace megatron {

ModelConfig adopt_architecture(Config& config, const ModelConfig& saved, const std::string& source, const std::string& via) {
  ModelConfig& m = config.model;
  auto given = [&](const char* flag) { return config.explicit_flags.count(flag) > 0; };
  auto check = [&](const char* flag, const std::string& ours, const std::string& theirs) {
    if (given(flag) && ours != theirs) {
      throw UserError("--" + std::string(flag) + " " + ours + " contradicts " + source + " (" + theirs + "); with " + via +
                      " the architecture comes from the checkpoint: drop the flag");
    }
  };
  auto str = [](auto v) {
    if constexpr (std::is_same_v<decltype(v), bool>) return std::string(v ? "true" : "false");
    else if constexpr (std::is_same_v<decltype(v), std::string>) return v;
    else return c10::str(v);
  };
  check("num-layers", str(m.num_layers), str(saved.num_layers));
  check("hidden-size", str(m.hidden_size), str(saved.hidden_size));
  check("ffn-hidden-size", str(m.ffn_hidden_size), str(saved.ffn_hidden_size));
  check("num-attention-heads", str(m.num_attention_heads), str(saved.num_attention_heads));
  check("num-query-groups", str(m.num_query_groups), str(saved.num_query_groups));
  check("group-query-attention", str(m.group_query_attention), str(saved.group_query_attention));
  check("kv-channels", str(m.kv_channels), str(saved.kv_channels));
  check("normalization", m.normalization, saved.normalization);
  check("norm-epsilon", str(m.norm_epsilon), str(saved.norm_epsilon));
  check("swiglu", str(m.swiglu), str(saved.swiglu));
  check("disable-bias-linear", str(!m.add_bias_linear), str(!saved.add_bias_linear));
  check("add-qkv-bias", str(m.add_qkv_bias), str(saved.add_qkv_bias));
  check("qk-layernorm", str(m.qk_layernorm), str(saved.qk_layernorm));
  check("position-embedding-type", m.position_embedding_type, saved.position_embedding_type);
  check("rotary-base", str(m.rotary_base), str(saved.rotary_base));
  check("use-rope-scaling", str(m.use_rope_scaling), str(saved.use_rope_scaling));
  check("rope-scaling-factor", str(m.rope_scaling_factor), str(saved.rope_scaling_factor));
  check("rotary-seq-len-interpolation-factor", str(m.rotary_seq_len_interpolation_factor),
        str(saved.rotary_seq_len_interpolation_factor));
  check("untie-embeddings-and-output-weights", str(m.untie_embeddings_and_output_weights),
        str(saved.untie_embeddings_and_output_weights));
  check("max-position-embeddings", str(m.max_position_embeddings), str(saved.max_position_embeddings));
  check("num-experts", str(m.num_experts), str(saved.num_experts));
  check("multi-latent-attention", str(m.multi_latent_attention), str(saved.multi_latent_attention));

  const ModelConfig user = m;
  m = saved;
  if (m.family == nullptr) m.family = user.family;  // state.json names none: the process's own
  m.make_vocab_size_divisible_by = user.make_vocab_size_divisible_by;
  m.padded_vocab_size_flag = user.padded_vocab_size_flag;
  m.extra_vocab_size = user.extra_vocab_size;
  m.init_method_std = user.init_method_std;
  if (given("seq-length")) m.seq_length = user.seq_length;
  if (given("hidden-dropout")) m.hidden_dropout = user.hidden_dropout;
  if (given("attention-dropout")) m.attention_dropout = user.attention_dropout;
  m.moe_router_bias_update_rate = user.moe_router_bias_update_rate;
  // What the saved model does not describe stays the run's own choice: fused kernels, activation
  // recomputation, and how the MoE layers route, balance, drop and dispatch.
  m.apply_rope_fusion = user.apply_rope_fusion;
  m.bias_swiglu_fusion = user.bias_swiglu_fusion;
  m.cross_entropy_loss_fusion = user.cross_entropy_loss_fusion;
  m.bias_dropout_fusion = user.bias_dropout_fusion;
  m.recompute_granularity = user.recompute_granularity;
  m.recompute_method = user.recompute_method;
  m.recompute_num_layers = user.recompute_num_layers;
  m.recompute_activations = user.recompute_activations;
  m.moe_router_dtype = user.moe_router_dtype;
  m.moe_router_force_load_balancing = user.moe_router_force_load_balancing;
  m.moe_router_load_balancing_type = user.moe_router_load_balancing_type;
  m.moe_aux_loss_coeff = user.moe_aux_loss_coeff;
  m.moe_z_loss_coeff = user.moe_z_loss_coeff;
  m.moe_expert_capacity_factor = user.moe_expert_capacity_factor;
  m.moe_token_drop_policy = user.moe_token_drop_policy;
  m.moe_pad_expert_input_to_capacity = user.moe_pad_expert_input_to_capacity;
  m.moe_grouped_gemm = user.moe_grouped_gemm;
  m.moe_token_dispatcher_type = user.moe_token_dispatcher_type;
  m.moe_permute_fusion = user.moe_permute_fusion;
  m.moe_shared_expert_overlap = user.moe_shared_expert_overlap;
  return user;
}

void adopt_checkpoint_args(Config& config) {
  const TrainConfig& t = config.train;
  if (t.load.empty()) throw UserError("--use-checkpoint-args takes the model from the checkpoint under --load: give --load DIR");
  if (!t.load_hf.empty()) {
    throw UserError("--use-checkpoint-args and --load-hf both name where the model comes from: pass one of them");
  }
  const std::string dir = checkpoint_directory_to_load(t.load, t.ckpt_step);
  if (dir.empty()) {
    config.flag_notices.push_back("--use-checkpoint-args: no checkpoint under --load " + t.load + ", so the model comes from the flags");
    return;
  }
  const nlohmann::json state = read_checkpoint_state(dir);
  const ModelConfig saved = saved_model_config(dir, state);  // checked field by field
  const ModelConfig user = adopt_architecture(config, saved, dir + "/state.json", "--use-checkpoint-args");
  auto given = [&](const char* flag) { return config.explicit_flags.count(flag) > 0; };
  // The padded rows take part in the softmax: pad as the saving run did (at its TP size).
  if (!given("make-vocab-size-divisible-by")) config.model.make_vocab_size_divisible_by = saved.make_vocab_size_divisible_by;
  DataConfig& d = config.data;
  if (!given("tokenizer-type") && !given("tokenizer-model") && state.contains("tokenizer")) {
    try {
      tokenizer_config_from_json(state["tokenizer"], d);
    } catch (const nlohmann::json::exception& e) {
      throw UserError(dir + "/state.json: tokenizer: a field is missing or of the wrong type (" + e.what() + ")");
    }
    d.eod_id = -1;  // derived again from the tokenizer
  }
  // --vocab-size is the tokenizer's ids where the tokenizer does not know them: NullTokenizer's
  // N (the model adds its end-of-document id), TikTokenizer's all.
  if (given("vocab-size")) {
    config.model.vocab_size = user.vocab_size;
  } else if (d.tokenizer_type == "NullTokenizer") {
    config.model.vocab_size = saved.vocab_size - 1;
  } else if (d.tokenizer_type == "TikTokenizer") {
    config.model.vocab_size = saved.vocab_size;
  }
}

}  // namespace megatron
