#include "checkpoint/checkpoint_records.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include "checkpoint/safetensors.h"
#include "core/errors.h"
#include "model/gpt_model.h"

namespace megatron {

std::vector<at::Generator> checkpoint_generators() {
  std::vector<at::Generator> gens = {at::detail::getDefaultCPUGenerator()};
  // The current device's generator: each rank has its own GPU.
  if (at::hasCUDA()) gens.push_back(at::globalContext().defaultGenerator(at::Device(at::kCUDA)));
  return gens;
}

nlohmann::json model_summary(const ModelConfig& m) {
  nlohmann::json j = {{"num_layers", m.num_layers}, {"hidden_size", m.hidden_size}, {"ffn_hidden_size", m.ffn_hidden_size},
          {"num_attention_heads", m.num_attention_heads}, {"num_query_groups", m.num_query_groups},
          {"kv_channels", m.kv_channels}, {"padded_vocab_size", m.padded_vocab_size},
          {"normalization", m.normalization}, {"swiglu", m.swiglu},
          {"position_embedding_type", m.position_embedding_type},
          {"untie_embeddings_and_output_weights", m.untie_embeddings_and_output_weights}};
  // With experts, what their tensors' shapes and names follow from (dense checkpoints: no keys).
  if (m.num_experts > 0) {
    j["num_experts"] = m.num_experts;
    j["moe_ffn_hidden_size"] = m.moe_ffn_hidden_size;
    j["moe_layers"] = m.moe_layers;
    j["moe_shared_expert_intermediate_size"] = m.moe_shared_expert_intermediate_size;
    if (m.moe_router_enable_expert_bias) j["moe_router_enable_expert_bias"] = true;
  }
  if (m.mtp_num_layers > 0) j["mtp_num_layers"] = m.mtp_num_layers;
  if (m.multi_latent_attention) {
    j["multi_latent_attention"] = true;
    j["q_lora_rank"] = m.q_lora_rank;
    j["kv_lora_rank"] = m.kv_lora_rank;
    j["qk_head_dim"] = m.qk_head_dim;
    j["qk_pos_emb_head_dim"] = m.qk_pos_emb_head_dim;
    j["v_head_dim"] = m.v_head_dim;
  }
  return j;
}

nlohmann::json layout_summary(const ParallelConfig& p, int tp, int pp, int dp) {
  return {{"tensor_model_parallel_size", tp},
          {"pipeline_model_parallel_size", pp},
          {"data_parallel_size", dp},
          {"use_distributed_optimizer", p.use_distributed_optimizer},
          {"num_virtual_stages_per_pipeline_rank", pp > 1 ? p.num_virtual_stages_per_pipeline_rank : 1},
          {"decoder_first_pipeline_num_layers", pp > 1 ? p.decoder_first_pipeline_num_layers : 0},
          {"decoder_last_pipeline_num_layers", pp > 1 ? p.decoder_last_pipeline_num_layers : 0},
          {"expert_model_parallel_size", p.expert_model_parallel_size},
          {"expert_tensor_parallel_size", p.expert_tensor_parallel_size > 0 ? p.expert_tensor_parallel_size : tp}};
}

nlohmann::json layout_summary(const Config& c, const dist::ParallelState& ps) {
  // Context-parallel ranks are replicas of the parameters: their optimizer shards count as DP ranks.
  return layout_summary(c.parallel, ps.tp.size(), ps.pp.size(), ps.dp_cp.size());
}

std::vector<std::pair<std::string, at::Tensor>> chunk_parameters(const std::vector<GPTModel*>& chunks) {
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (GPTModel* chunk : chunks) {
    for (const auto& p : chunk->named_parameters()) params.emplace_back(p.key(), p.value());
  }
  return params;
}

tp::ParamTable chunk_table(const std::vector<GPTModel*>& chunks) {
  tp::ParamTable table;
  for (GPTModel* chunk : chunks) table.merge(chunk->parameter_table());
  return table;
}

void load_parameters(const SafetensorsFile& file, const std::vector<std::pair<std::string, at::Tensor>>& params) {
  at::NoGradGuard no_grad;
  for (const auto& [name, param] : params) {
    if (!file.contains(name)) throw UserError(file.path() + " has no tensor '" + name + "' (a checkpoint of another layout or model?)");
    at::Tensor saved = file.view_floating(name);
    if (!saved.sizes().equals(param.sizes())) {
      throw UserError(file.path() + ": tensor '" + name + "' has shape " + c10::str(saved.sizes()) + ", the model expects " +
                      c10::str(param.sizes()));
    }
    at::Tensor(param).copy_(saved);
  }
}

}  // namespace megatron
