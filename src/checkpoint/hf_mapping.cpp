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
#include "model/parameter_names.h"
#include "tensor_parallel/sharding.h"

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

HfCheckpointReader::HfCheckpointReader(const std::string& dir) : dir_(dir) {
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
  }
}

bool HfCheckpointReader::has(const std::string& name) const { return by_name_.count(name) > 0; }

at::Tensor HfCheckpointReader::take(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) throw UserError(dir_ + ": Hugging Face checkpoint lacks tensor '" + name + "'");
  used_.insert(name);
  return it->second->view(name);
}

void HfCheckpointReader::check_all_used() const {
  for (const auto& [name, file] : by_name_) {
    if (!used_.count(name) && name.find("rotary_emb.inv_freq") == std::string::npos) {
      throw UserError(file->path() + ": tensor '" + name + "' has no place in the model (unsupported architecture option?)");
    }
  }
}

std::vector<std::string> megatron_parameter_names(const ModelConfig& c) {
  std::vector<std::string> names = {kWordEmbeddings};
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "decoder.layers." + std::to_string(i) + ".";
    names.push_back(p + "self_attention.linear_qkv.layer_norm_weight");
    names.push_back(p + "self_attention.linear_qkv.weight");
    if (c.add_qkv_bias) names.push_back(p + "self_attention.linear_qkv.bias");
    if (c.qk_layernorm) {
      names.push_back(p + "self_attention.q_layernorm.weight");
      names.push_back(p + "self_attention.k_layernorm.weight");
    }
    names.push_back(p + "self_attention.linear_proj.weight");
    names.push_back(p + "mlp.linear_fc1.layer_norm_weight");
    names.push_back(p + "mlp.linear_fc1.weight");
    names.push_back(p + "mlp.linear_fc2.weight");
  }
  names.push_back("decoder.final_layernorm.weight");
  if (c.untie_embeddings_and_output_weights) names.push_back(kOutputLayer);
  return names;
}

namespace {

// "decoder.layers.12.self_attention.linear_qkv.weight" -> {"model.layers.12.", "self_attention.linear_qkv.weight"}
std::pair<std::string, std::string> split_layer_name(const std::string& name) {
  const std::string prefix = "decoder.layers.";
  const size_t dot = name.find('.', prefix.size());
  return {"model.layers." + name.substr(prefix.size(), dot - prefix.size()) + ".", name.substr(dot + 1)};
}

at::Tensor padded_rows(const at::Tensor& t, int64_t rows) {
  if (t.size(0) > rows) {
    throw UserError("Hugging Face vocabulary (" + std::to_string(t.size(0)) + ") exceeds the model's padded vocabulary (" +
                    std::to_string(rows) + ")");
  }
  if (t.size(0) == rows) return t;
  // Rows past the HF vocabulary (Megatron's padding) are zero.
  return at::cat({t, at::zeros({rows - t.size(0), t.size(1)}, t.options())}, 0);
}

}  // namespace

at::Tensor megatron_tensor_from_hf(const std::string& name, const ModelConfig& c, HfCheckpointReader& hf) {
  const int64_t H = c.num_attention_heads, G = c.num_query_groups, d = c.kv_channels;
  if (name == kWordEmbeddings) return padded_rows(hf.take("model.embed_tokens.weight"), c.padded_vocab_size);
  if (name == kOutputLayer) {
    return padded_rows(hf.has("lm_head.weight") ? hf.take("lm_head.weight") : hf.take("model.embed_tokens.weight"),
                       c.padded_vocab_size);
  }
  if (name == "decoder.final_layernorm.weight") return hf.take("model.norm.weight");
  const auto [p, rest] = split_layer_name(name);
  // Megatron's fused layout: per query group, its H/G query heads, one key head, one value head.
  auto fuse = [&](const std::string& suffix, int64_t cols) {
    at::Tensor q = hf.take(p + "self_attn.q_proj." + suffix).reshape({G, H / G * d, cols});
    at::Tensor k = hf.take(p + "self_attn.k_proj." + suffix).reshape({G, d, cols});
    at::Tensor v = hf.take(p + "self_attn.v_proj." + suffix).reshape({G, d, cols});
    return at::cat({q, k, v}, 1).reshape({(H + 2 * G) * d, cols});
  };
  if (rest == "self_attention.linear_qkv.layer_norm_weight") return hf.take(p + "input_layernorm.weight");
  if (rest == "self_attention.linear_qkv.weight") return fuse("weight", c.hidden_size);
  if (rest == "self_attention.linear_qkv.bias") return fuse("bias", 1).view({-1});
  if (rest == "self_attention.q_layernorm.weight") return hf.take(p + "self_attn.q_norm.weight");
  if (rest == "self_attention.k_layernorm.weight") return hf.take(p + "self_attn.k_norm.weight");
  if (rest == "self_attention.linear_proj.weight") return hf.take(p + "self_attn.o_proj.weight");
  if (rest == "mlp.linear_fc1.layer_norm_weight") return hf.take(p + "post_attention_layernorm.weight");
  if (rest == "mlp.linear_fc1.weight") return at::cat({hf.take(p + "mlp.gate_proj.weight"), hf.take(p + "mlp.up_proj.weight")}, 0);
  if (rest == "mlp.linear_fc2.weight") return hf.take(p + "mlp.down_proj.weight");
  throw UserError("parameter '" + name + "' has no Hugging Face counterpart (the HF export covers the Llama family)");
}

std::vector<std::pair<std::string, at::Tensor>> hf_tensors_from_megatron(const std::string& name, const at::Tensor& full,
                                                                         const ModelConfig& c, int64_t hf_vocab) {
  const int64_t H = c.num_attention_heads, G = c.num_query_groups, d = c.kv_channels;
  if (name == kWordEmbeddings) return {{"model.embed_tokens.weight", full.narrow(0, 0, hf_vocab)}};
  if (name == kOutputLayer) return {{"lm_head.weight", full.narrow(0, 0, hf_vocab)}};
  if (name == "decoder.final_layernorm.weight") return {{"model.norm.weight", full}};
  const auto [p, rest] = split_layer_name(name);
  auto unfuse = [&](const std::string& suffix, int64_t cols) -> std::vector<std::pair<std::string, at::Tensor>> {
    auto parts = full.reshape({G, (H / G + 2) * d, cols}).split_with_sizes({H / G * d, d, d}, 1);
    auto shaped = [&](const at::Tensor& t, int64_t rows) {
      return cols == 1 ? t.reshape({rows}) : t.reshape({rows, cols});
    };
    return {{p + "self_attn.q_proj." + suffix, shaped(parts[0], H * d)},
            {p + "self_attn.k_proj." + suffix, shaped(parts[1], G * d)},
            {p + "self_attn.v_proj." + suffix, shaped(parts[2], G * d)}};
  };
  if (rest == "self_attention.linear_qkv.layer_norm_weight") return {{p + "input_layernorm.weight", full}};
  if (rest == "self_attention.linear_qkv.weight") return unfuse("weight", c.hidden_size);
  if (rest == "self_attention.linear_qkv.bias") return unfuse("bias", 1);
  if (rest == "self_attention.q_layernorm.weight") return {{p + "self_attn.q_norm.weight", full}};
  if (rest == "self_attention.k_layernorm.weight") return {{p + "self_attn.k_norm.weight", full}};
  if (rest == "self_attention.linear_proj.weight") return {{p + "self_attn.o_proj.weight", full}};
  if (rest == "mlp.linear_fc1.layer_norm_weight") return {{p + "post_attention_layernorm.weight", full}};
  if (rest == "mlp.linear_fc1.weight") {
    auto halves = full.chunk(2, 0);
    return {{p + "mlp.gate_proj.weight", halves[0]}, {p + "mlp.up_proj.weight", halves[1]}};
  }
  if (rest == "mlp.linear_fc2.weight") return {{p + "mlp.down_proj.weight", full}};
  throw UserError("parameter '" + name + "' has no Hugging Face counterpart (the HF export covers the Llama family)");
}

void adopt_hf_architecture(Config& config) {
  const std::string& dir = config.train.load_hf;
  const ModelConfig hf = model_config_from_hf(dir);
  ModelConfig& m = config.model;
  auto given = [&](const char* flag) { return config.explicit_flags.count(flag) > 0; };
  auto check = [&](const char* flag, const std::string& ours, const std::string& theirs) {
    if (given(flag) && ours != theirs) {
      throw UserError("--" + std::string(flag) + " " + ours + " contradicts " + dir + "/config.json (" + theirs +
                      "); with --load-hf the architecture comes from the checkpoint: drop the flag");
    }
  };
  auto str = [](auto v) {
    if constexpr (std::is_same_v<decltype(v), bool>) return std::string(v ? "true" : "false");
    else if constexpr (std::is_same_v<decltype(v), std::string>) return v;
    else return c10::str(v);
  };
  check("num-layers", str(m.num_layers), str(hf.num_layers));
  check("hidden-size", str(m.hidden_size), str(hf.hidden_size));
  check("ffn-hidden-size", str(m.ffn_hidden_size), str(hf.ffn_hidden_size));
  check("num-attention-heads", str(m.num_attention_heads), str(hf.num_attention_heads));
  check("num-query-groups", str(m.num_query_groups), str(hf.num_query_groups));
  check("group-query-attention", str(m.group_query_attention), str(hf.group_query_attention));
  check("kv-channels", str(m.kv_channels), str(hf.kv_channels));
  check("normalization", m.normalization, hf.normalization);
  check("norm-epsilon", str(m.norm_epsilon), str(hf.norm_epsilon));
  check("swiglu", str(m.swiglu), str(hf.swiglu));
  check("disable-bias-linear", str(!m.add_bias_linear), str(!hf.add_bias_linear));
  check("add-qkv-bias", str(m.add_qkv_bias), str(hf.add_qkv_bias));
  check("qk-layernorm", str(m.qk_layernorm), str(hf.qk_layernorm));
  check("position-embedding-type", m.position_embedding_type, hf.position_embedding_type);
  check("rotary-base", str(m.rotary_base), str(hf.rotary_base));
  check("use-rope-scaling", str(m.use_rope_scaling), str(hf.use_rope_scaling));
  check("rope-scaling-factor", str(m.rope_scaling_factor), str(hf.rope_scaling_factor));
  check("untie-embeddings-and-output-weights", str(m.untie_embeddings_and_output_weights),
        str(hf.untie_embeddings_and_output_weights));
  check("max-position-embeddings", str(m.max_position_embeddings), str(hf.max_position_embeddings));

  const ModelConfig user = m;
  m = hf;
  m.hf_vocab_size = hf.vocab_size;
  m.vocab_size = user.vocab_size;  // the tokenizer's, settled by finalize_config
  m.make_vocab_size_divisible_by = user.make_vocab_size_divisible_by;
  m.init_method_std = user.init_method_std;
  if (given("seq-length")) m.seq_length = user.seq_length;
  if (given("hidden-dropout")) m.hidden_dropout = user.hidden_dropout;
  if (given("attention-dropout")) m.attention_dropout = user.attention_dropout;
  DataConfig& d = config.data;
  if (!given("tokenizer-type") && !given("tokenizer-model") && fs::exists(dir + "/tokenizer.json")) {
    d.tokenizer_type = "HuggingFaceTokenizer";
    d.tokenizer_model = dir;
  }
}

void load_hf_weights(const std::string& dir, GPTModel& model) { load_hf_weights(dir, std::vector<GPTModel*>{&model}); }

void load_hf_weights(const std::string& dir, const std::vector<GPTModel*>& chunks) {
  at::NoGradGuard no_grad;
  HfCheckpointReader hf(dir);
  for (GPTModel* model : chunks) {
    const tp::TensorParallel& tp = model->tensor_parallel();
    for (auto& item : model->named_parameters()) {
      const std::string& name = item.key();
      at::Tensor& param = item.value();
      const at::Tensor full = megatron_tensor_from_hf(name, model->config(), hf);
      const at::Tensor shard = tp::shard_of(full, tp::shard_spec(name, model->config().swiglu), tp.rank(), tp.size());
      if (!shard.sizes().equals(param.sizes())) {
        throw UserError(dir + ": tensor for '" + name + "' has shape " + c10::str(shard.sizes()) + " on this rank, the model expects " +
                        c10::str(param.sizes()) + " (does config.json match the model flags?)");
      }
      param.copy_(shard);
    }
  }
  // A pipeline stage uses only its own layers' tensors.
  const bool whole_model = chunks.size() == 1 && chunks[0]->chunk().num_layers == chunks[0]->config().num_layers;
  if (whole_model) hf.check_all_used();
}

}  // namespace megatron
