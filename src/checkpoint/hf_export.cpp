#include "checkpoint/hf_export.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/hf_mapping.h"
#include "checkpoint/safetensors.h"
#include "core/errors.h"
#include "core/files.h"

namespace megatron {
namespace fs = std::filesystem;

nlohmann::json hf_config_json(const ModelConfig& m, int64_t hf_vocab, at::ScalarType dtype) {
  if (m.normalization != "RMSNorm" || !m.swiglu || m.add_bias_linear || m.position_embedding_type != "rope") {
    throw UserError("only Llama-family models (RMSNorm, SwiGLU, RoPE, no linear biases but QKV's) export to Hugging Face");
  }
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
  if (m.use_rope_scaling) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", m.rope_scaling_factor},
                         {"low_freq_factor", m.rope_low_freq_factor},
                         {"high_freq_factor", m.rope_high_freq_factor},
                         {"original_max_position_embeddings", m.rope_original_max_position_embeddings}};
  }
  return j;
}

void save_hf_checkpoint(const std::string& out_dir, const ModelConfig& model, int64_t hf_vocab,
                        const std::function<at::Tensor(const std::string&)>& full_tensor, const HfExportOptions& options) {
  if (fs::exists(out_dir) && !fs::is_empty(out_dir)) {
    throw UserError(out_dir + " exists and is not empty: export into a new directory");
  }
  const std::string tmp = temporary_name(out_dir);
  remove_tree(tmp);
  make_directories(tmp);

  std::vector<std::string> shard_files;             // temporary names, renamed once the count is known
  std::vector<std::vector<std::string>> shard_names;
  std::vector<SafetensorsEntry> pending;
  int64_t pending_bytes = 0, total_bytes = 0;
  at::ScalarType dtype = at::kFloat;
  auto flush = [&] {
    if (pending.empty()) return;
    char name[64];
    std::snprintf(name, sizeof(name), "shard-%05zu.safetensors", shard_files.size());
    save_safetensors(tmp + "/" + name, pending, {{"format", "pt"}});
    shard_files.push_back(name);
    shard_names.emplace_back();
    for (const auto& e : pending) shard_names.back().push_back(e.name);
    pending.clear();
    pending_bytes = 0;
  };
  for (const auto& name : megatron_parameter_names(model)) {
    const at::Tensor full = full_tensor(name);
    dtype = full.scalar_type();
    for (auto& [hf_name, tensor] : hf_tensors_from_megatron(name, full, model, hf_vocab)) {
      const int64_t bytes = tensor.numel() * int64_t(tensor.element_size());
      if (pending_bytes > 0 && pending_bytes + bytes > options.max_shard_bytes) flush();
      pending.push_back({hf_name, tensor.contiguous()});
      pending_bytes += bytes;
      total_bytes += bytes;
    }
  }
  flush();

  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shard_files.size(); ++i) {
    char final_name[64];
    if (shard_files.size() == 1) {
      std::snprintf(final_name, sizeof(final_name), "model.safetensors");
    } else {
      std::snprintf(final_name, sizeof(final_name), "model-%05zu-of-%05zu.safetensors", i + 1, shard_files.size());
    }
    fs::rename(tmp + "/" + shard_files[i], tmp + "/" + final_name);
    for (const auto& n : shard_names[i]) weight_map[n] = final_name;
  }
  if (shard_files.size() > 1) {
    const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    write_file_atomic(tmp + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  write_file_atomic(tmp + "/config.json", options.config_json.empty()
                                              ? hf_config_json(model, hf_vocab, dtype).dump(2) + "\n"
                                              : read_file(options.config_json));
  if (!options.tokenizer_dir.empty()) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                          "vocab.json", "merges.txt", "generation_config.json"}) {
      const std::string from = options.tokenizer_dir + "/" + f;
      if (fs::exists(from)) write_file_atomic(tmp + "/" + f, read_file(from));
    }
  }
  fsync_path(tmp);
  if (fs::exists(out_dir)) fs::remove(out_dir);  // empty (checked above)
  fs::rename(tmp, out_dir);
  fsync_path(fs::path(out_dir).parent_path().empty() ? "." : fs::path(out_dir).parent_path().string());
}

}  // namespace megatron
