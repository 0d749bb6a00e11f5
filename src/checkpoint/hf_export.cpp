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
#include "model/family.h"
#include "model/gpt_model.h"

namespace megatron {
namespace fs = std::filesystem;

nlohmann::json hf_config_json(const ModelConfig& m, int64_t hf_vocab, at::ScalarType dtype) {
  const ModelFamily& family = family_of(m);
  if (!family.config_to_hf) {
    throw UserError("only Llama-family models (RMSNorm, SwiGLU, RoPE, no linear biases but QKV's) export to Hugging Face");
  }
  if (m.routes_by_sinkhorn()) {
    // Its experts' weights are the softmax over all experts (sigmoid for top-1), which no HF MoE
    // router of these families computes: the exported model would route differently.
    throw UserError("a model trained with --moe-router-load-balancing-type sinkhorn does not export to Hugging Face: " + family.name +
                    "'s router weighs the chosen experts otherwise");
  }
  return family.config_to_hf(m, hf_vocab, dtype);
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
  const tp::ParamTable params = describe_model(model);
  for (const auto& name : params.names()) {
    const at::Tensor full = full_tensor(name);
    if (!params.at(name).keep_fp32) dtype = full.scalar_type();  // the model's dtype, for config.json
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
