#include "checkpoint/hf_mapping.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/safetensors.h"
#include "core/errors.h"
#include "core/files.h"
#include "model/gpt_model.h"

namespace megatron {
namespace fs = std::filesystem;
namespace {

nlohmann::json read_json(const std::string& path) {
  try {
    return nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path + ": invalid JSON: " + e.what());
  }
}

// All tensors of an HF checkpoint directory, by name, across shards.
class HfTensors {
 public:
  explicit HfTensors(const std::string& dir) {
    const std::string index = dir + "/model.safetensors.index.json";
    std::vector<std::string> files;
    if (fs::exists(index)) {
      std::set<std::string> unique;
      for (auto& [name, file] : read_json(index).at("weight_map").items()) unique.insert(file.get<std::string>());
      files.assign(unique.begin(), unique.end());
    } else if (fs::exists(dir + "/model.safetensors")) {
      files.push_back("model.safetensors");
    } else {
      throw UserError(dir + ": no model.safetensors or model.safetensors.index.json; is this a Hugging Face model directory?");
    }
    for (const auto& f : files) {
      auto file = std::make_shared<SafetensorsFile>(dir + "/" + f);
      for (const auto& name : file->names()) by_name_[name] = file;
      files_.push_back(file);
    }
  }

  bool has(const std::string& name) const { return by_name_.count(name) > 0; }

  at::Tensor take(const std::string& name) {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) throw UserError("Hugging Face checkpoint lacks tensor '" + name + "'");
    used_.insert(name);
    return it->second->view(name);
  }

  void check_all_used() const {
    for (const auto& [name, file] : by_name_) {
      if (!used_.count(name) && name.find("rotary_emb.inv_freq") == std::string::npos) {
        throw UserError(file->path() + ": tensor '" + name + "' has no place in the model (unsupported architecture option?)");
      }
    }
  }

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> by_name_;
  std::set<std::string> used_;
};

void copy_into(at::Tensor& param, const at::Tensor& value, const std::string& name) {
  if (!param.sizes().equals(value.sizes())) {
    throw UserError("tensor for '" + name + "' has shape " + c10::str(value.sizes()) + ", the model expects " +
                    c10::str(param.sizes()));
  }
  param.copy_(value);
}

}  // namespace

ModelConfig model_config_from_hf(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const nlohmann::json j = read_json(path);
  const std::string type = j.value("model_type", "");
  static const std::set<std::string> supported = {"llama", "mistral", "qwen2", "qwen3"};
  if (!supported.count(type)) {
    throw UserError(path + ": model_type '" + type + "' is not supported yet (llama, mistral, qwen2, qwen3)");
  }
  ModelConfig m;
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
  m.normalization = "RMSNorm";
  m.norm_epsilon = j.value("rms_norm_eps", 1e-6);
  m.swiglu = true;
  m.add_bias_linear = false;
  m.add_qkv_bias = type == "qwen2" || j.value("attention_bias", false);
  m.qk_layernorm = type == "qwen3";
  m.position_embedding_type = "rope";
  m.untie_embeddings_and_output_weights = !j.value("tie_word_embeddings", false);
  m.hidden_dropout = 0.0;
  m.attention_dropout = 0.0;
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
  } else if (rope_type != "default") {
    throw UserError(path + ": rope type '" + rope_type + "' is not supported yet (default, llama3)");
  }
  return m;
}

void load_hf_weights(const std::string& dir, GPTModel& model) {
  at::NoGradGuard no_grad;
  const ModelConfig& c = model.config();
  HfTensors hf(dir);
  const int64_t H = c.num_attention_heads, G = c.num_query_groups, d = c.kv_channels, h = c.hidden_size;

  at::Tensor embed = hf.take("model.embed_tokens.weight");  // [V_hf, h]
  if (embed.size(0) > model.word_embeddings.size(0)) {
    throw UserError("Hugging Face vocabulary (" + std::to_string(embed.size(0)) + ") exceeds the model's padded vocabulary");
  }
  // Rows past the HF vocabulary (Megatron's padding) are zero.
  model.word_embeddings.zero_();
  model.word_embeddings.narrow(0, 0, embed.size(0)).copy_(embed);
  if (c.untie_embeddings_and_output_weights) {
    at::Tensor head = hf.has("lm_head.weight") ? hf.take("lm_head.weight") : embed;
    model.output_layer_weight.zero_();
    model.output_layer_weight.narrow(0, 0, head.size(0)).copy_(head);
  }
  copy_into(model.final_layernorm_weight, hf.take("model.norm.weight"), "model.norm.weight");

  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto* layer = model.layers[i]->as<TransformerLayer>();
    const std::string p = "model.layers." + std::to_string(i) + ".";
    auto& attn = *layer->self_attention;
    copy_into(attn.linear_qkv->layer_norm_weight, hf.take(p + "input_layernorm.weight"), p + "input_layernorm.weight");
    // Megatron's fused layout: per query group, its H/G query heads, one key head, one value head.
    auto fuse = [&](const std::string& suffix, int64_t cols) {
      at::Tensor q = hf.take(p + "self_attn.q_proj." + suffix).reshape({G, H / G * d, cols});
      at::Tensor k = hf.take(p + "self_attn.k_proj." + suffix).reshape({G, d, cols});
      at::Tensor v = hf.take(p + "self_attn.v_proj." + suffix).reshape({G, d, cols});
      return at::cat({q, k, v}, 1).reshape({(H + 2 * G) * d, cols});
    };
    copy_into(attn.linear_qkv->weight, fuse("weight", h), p + "self_attn.{q,k,v}_proj.weight");
    if (attn.linear_qkv->bias.defined()) {
      copy_into(attn.linear_qkv->bias, fuse("bias", 1).view({-1}), p + "self_attn.{q,k,v}_proj.bias");
    }
    copy_into(attn.linear_proj->weight, hf.take(p + "self_attn.o_proj.weight"), p + "self_attn.o_proj.weight");
    if (attn.q_layernorm_weight.defined()) {
      copy_into(attn.q_layernorm_weight, hf.take(p + "self_attn.q_norm.weight"), p + "self_attn.q_norm.weight");
      copy_into(attn.k_layernorm_weight, hf.take(p + "self_attn.k_norm.weight"), p + "self_attn.k_norm.weight");
    }
    auto& mlp = *layer->mlp;
    copy_into(mlp.linear_fc1->layer_norm_weight, hf.take(p + "post_attention_layernorm.weight"),
              p + "post_attention_layernorm.weight");
    copy_into(mlp.linear_fc1->weight,
              at::cat({hf.take(p + "mlp.gate_proj.weight"), hf.take(p + "mlp.up_proj.weight")}, 0),
              p + "mlp.{gate,up}_proj.weight");
    copy_into(mlp.linear_fc2->weight, hf.take(p + "mlp.down_proj.weight"), p + "mlp.down_proj.weight");
  }
  hf.check_all_used();
}

}  // namespace megatron
