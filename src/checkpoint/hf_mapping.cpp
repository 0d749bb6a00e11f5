#include "checkpoint/hf_mapping.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/adopt_architecture.h"
#include "checkpoint/hf_config_check.h"
#include "checkpoint/safetensors.h"
#include "core/errors.h"
#include "core/files.h"
#include "core/json_text.h"
#include "model/gpt_model.h"
#include "model/family.h"
#include "model/parameter_names.h"
#include "tensor_parallel/sharding.h"

namespace megatron {
namespace fs = std::filesystem;

ModelConfig model_config_from_hf(const std::string& dir, const ModelFamily* family) {
  const std::string path = dir + "/config.json";
  const nlohmann::json j = parse_json_file(path);
  check_hf_config_fields(j, path);
  const std::string type = j.value("model_type", "");
  if (family != nullptr && std::find(family->hf_model_types.begin(), family->hf_model_types.end(), type) ==
                               family->hf_model_types.end()) {
    throw UserError(path + ": model_type '" + type + "' is not one the " + family->name + " family reads");
  }
  const ModelFamily& f = family != nullptr ? *family : family_for_hf_type(type, path);
  ModelConfig m;
  try {
    m = f.config_from_hf(j, path);
  } catch (const nlohmann::json::exception& e) {  // a field the check above does not know (a family's own)
    throw UserError(path + ": " + e.what());
  }
  check_hf_model_sizes(m, path);
  m.family = &f;
  return m;
}

HfCheckpointReader::HfCheckpointReader(const std::string& dir) : dir_(dir) {
  const std::string index = dir + "/model.safetensors.index.json";
  std::vector<std::string> files;
  if (fs::exists(index)) {
    std::set<std::string> unique;
    const nlohmann::json j = parse_json_file(index);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      throw UserError(index + ": no \"weight_map\" object (tensor name -> shard file)");
    }
    for (auto& [name, file] : j["weight_map"].items()) {
      // A shard is a file beside the index: a path elsewhere is refused, not followed.
      if (!file.is_string() || file.get<std::string>().empty() || file.get<std::string>().find('/') != std::string::npos) {
        throw UserError(index + ": weight_map[\"" + name + "\"] must name a shard file in " + dir + ", got " + file.dump());
      }
      unique.insert(file.get<std::string>());
    }
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
  const std::string config = dir + "/config.json";
  if (fs::exists(config)) {
    const nlohmann::json j = parse_json_file(config);
    if (j.contains("quantization_config") && j["quantization_config"].contains("weight_block_size")) {
      const nlohmann::json& block = j["quantization_config"]["weight_block_size"];
      if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() || !block[1].is_number_integer() ||
          block[0].get<int64_t>() <= 0 || block[1].get<int64_t>() <= 0) {
        throw UserError(config + ": quantization_config.weight_block_size must be two positive integers (got " + block.dump() + ")");
      }
      block_rows_ = block[0].get<int64_t>();
      block_cols_ = block[1].get<int64_t>();
    }
  }
}

bool HfCheckpointReader::has(const std::string& name) const { return by_name_.count(name) > 0; }

at::Tensor HfCheckpointReader::take(const std::string& name, at::IntArrayRef expected) {
  const at::Tensor t = take(name);
  if (!t.sizes().equals(expected)) {
    throw UserError(by_name_.at(name)->path() + ": tensor '" + name + "' has shape " + c10::str(t.sizes()) + "; " + dir_ +
                    "/config.json makes it " + c10::str(expected) + " (a config.json of another model, or a damaged shard)");
  }
  return t;
}

at::Tensor HfCheckpointReader::take(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) throw UserError(dir_ + ": Hugging Face checkpoint lacks tensor '" + name + "'");
  used_.insert(name);
  if (verified_.insert(it->second.get()).second) it->second->verify_checksum();
  const at::Tensor t = it->second->view_floating(name);
  if (t.scalar_type() != at::kFloat8_e4m3fn && t.scalar_type() != at::kFloat8_e5m2) return t;
  // W[i, j] = fp8 W[i, j] x scale_inv[i / block rows, j / block columns], edge blocks partial.
  const std::string scale_name = name + "_scale_inv";
  auto scale_it = by_name_.find(scale_name);
  if (scale_it == by_name_.end()) {
    throw UserError(it->second->path() + ": tensor '" + name + "' is FP8 but the checkpoint has no '" + scale_name +
                    "' to dequantise it with");
  }
  used_.insert(scale_name);
  if (verified_.insert(scale_it->second.get()).second) scale_it->second->verify_checksum();
  const at::Tensor scale = scale_it->second->view_floating(scale_name).to(at::kFloat);
  const int64_t rows = t.size(0), cols = t.dim() > 1 ? t.size(1) : 1;
  const int64_t row_blocks = (rows + block_rows_ - 1) / block_rows_, col_blocks = (cols + block_cols_ - 1) / block_cols_;
  if (t.dim() != 2 || scale.dim() != 2 || scale.size(0) != row_blocks || scale.size(1) != col_blocks) {
    throw UserError(scale_it->second->path() + ": '" + scale_name + "' has shape " + c10::str(scale.sizes()) + "; the " +
                    c10::str(t.sizes()) + " weight in blocks of " + std::to_string(block_rows_) + " x " +
                    std::to_string(block_cols_) + " needs [" + std::to_string(row_blocks) + ", " + std::to_string(col_blocks) + "]");
  }
  const at::Tensor per_element =
      scale.repeat_interleave(block_rows_, 0).narrow(0, 0, rows).repeat_interleave(block_cols_, 1).narrow(1, 0, cols);
  return t.to(at::kFloat) * per_element;
}

void ignore_unbuilt_hf_layers(HfCheckpointReader& hf, const ModelConfig& c) {
  for (int k = 0; k < c.hf_mtp_layers; ++k) {
    const std::string layer = "model.layers." + std::to_string(c.num_layers + k) + ".";
    if (k >= c.mtp_num_layers) {
      hf.ignore_prefix(layer);  // a depth this model does not build
    } else {  // DeepSeek's copies of the embedding and output layer in each depth: the model's own serve
      hf.ignore_prefix(layer + "embed_tokens.");
      hf.ignore_prefix(layer + "shared_head.head.");
    }
  }
}

void HfCheckpointReader::check_all_used() const {
  for (const auto& [name, file] : by_name_) {
    bool ignored = false;
    for (const auto& prefix : ignored_) ignored = ignored || name.rfind(prefix, 0) == 0;
    if (!used_.count(name) && !ignored && name.find("rotary_emb.inv_freq") == std::string::npos) {
      throw UserError(file->path() + ": tensor '" + name + "' has no place in the model (unsupported architecture option?)");
    }
  }
}

namespace {

// Numbered slots in the table's names: a decoder layer's number, an expert's, a multi-token
// prediction depth's (whose HF layer number, {mtp_layer}, follows the decoder's layers).
const char* const kSlots[] = {"{layer}", "{expert}", "{mtp}"};

// Whether `name` matches `pattern`, each slot standing for a number; the numbers into `values`.
bool match_slots(const std::string& pattern, const std::string& name, std::map<std::string, std::string>& values) {
  size_t p = 0, n = 0;
  while (p < pattern.size()) {
    bool slot = false;
    for (const char* s : kSlots) {
      const size_t len = std::strlen(s);
      if (pattern.compare(p, len, s) != 0) continue;
      const size_t begin = n;
      while (n < name.size() && name[n] >= '0' && name[n] <= '9') ++n;
      if (n == begin) return false;
      values[s] = name.substr(begin, n - begin);
      p += len;
      slot = true;
      break;
    }
    if (slot) continue;
    if (n >= name.size() || pattern[p] != name[n]) return false;
    ++p, ++n;
  }
  return n == name.size();
}

std::string with_slots(std::string pattern, const std::map<std::string, std::string>& values) {
  for (const auto& [slot, value] : values) {
    for (size_t at = pattern.find(slot); at != std::string::npos; at = pattern.find(slot)) pattern.replace(at, slot.size(), value);
  }
  return pattern;
}

// The row of a family's weight table for one Megatron parameter, its HF names filled in with
// the parameter's decoder layer (and expert) number.
struct ResolvedRow {
  const HfWeightRule* rule;
  std::vector<std::string> hf;  // rule->hf with the slots filled in
  std::string fallback;         // rule->hf_fallback likewise ("" without one)
};

ResolvedRow resolve_row(const ModelFamily& family, const std::string& name, const ModelConfig& c) {
  for (const auto& rule : family.weights) {
    std::map<std::string, std::string> values;
    if (!match_slots(rule.megatron, name, values)) continue;
    if (values.count("{mtp}")) values["{mtp_layer}"] = std::to_string(c.num_layers + std::stoi(values["{mtp}"]));
    ResolvedRow row{&rule, {}, rule.hf_fallback.empty() ? "" : with_slots(rule.hf_fallback, values)};
    for (const auto& pattern : rule.hf) row.hf.push_back(with_slots(pattern, values));
    return row;
  }
  throw UserError("parameter '" + name + "' has no Hugging Face counterpart in the weight table of the " + family.name +
                  " family");
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

namespace {

// The Megatron tensor of shape `shape` as HF's values give it (norms: the scale itself), each
// HF tensor's shape checked against the part of `shape` it makes.
at::Tensor megatron_tensor_from_hf_values(const std::string& name, const ModelConfig& c, HfCheckpointReader& hf,
                                          at::IntArrayRef shape) {
  const ResolvedRow row = resolve_row(family_of(c), name, c);
  const std::vector<std::string>& names = row.hf;
  std::vector<int64_t> part = shape.vec();
  switch (row.rule->transform) {
    case HfTransform::Copy: return hf.take(names[0], shape);
    case HfTransform::VocabRows: {
      const bool fallback = !row.fallback.empty() && !hf.has(names[0]);
      part[0] = c.hf_vocab_size > 0 ? c.hf_vocab_size : c.vocab_size;  // config.json's vocab_size
      return padded_rows(hf.take(fallback ? row.fallback : names[0], part), c.padded_vocab_size);
    }
    case HfTransform::GateUp: {
      part[0] = shape[0] / 2;
      return at::cat({hf.take(names[0], part), hf.take(names[1], part)}, 0);
    }
    case HfTransform::QkvFused: {
      // Megatron's fused layout: per query group, its H/G query heads, one key head, one value head.
      const int64_t H = c.num_attention_heads, G = c.num_query_groups, d = c.kv_channels;
      std::vector<int64_t> q_shape = part, kv_shape = part;  // weights [out, h], biases [out]
      q_shape[0] = H * d;
      kv_shape[0] = G * d;
      const at::Tensor q = hf.take(names[0], q_shape), k = hf.take(names[1], kv_shape), v = hf.take(names[2], kv_shape);
      const int64_t cols = q.dim() == 2 ? q.size(1) : 1;
      at::Tensor fused = at::cat({q.reshape({G, H / G * d, cols}), k.reshape({G, d, cols}), v.reshape({G, d, cols})}, 1);
      return q.dim() == 2 ? fused.reshape({(H + 2 * G) * d, cols}) : fused.reshape({-1});
    }
  }
  TORCH_CHECK(false, "unknown HfTransform");
}

}  // namespace

// HF stores a norm's scale; --apply-layernorm-1p models store the scale minus one.
at::Tensor megatron_tensor_from_hf(const std::string& name, const ModelConfig& c, HfCheckpointReader& hf, at::IntArrayRef shape) {
  const at::Tensor t = megatron_tensor_from_hf_values(name, c, hf, shape);
  return c.layernorm_zero_centered_gamma && is_norm_weight(name) ? t.to(at::kFloat) - 1.0 : t;
}

std::vector<std::pair<std::string, at::Tensor>> hf_tensors_from_megatron(const std::string& name, const at::Tensor& full,
                                                                         const ModelConfig& c, int64_t hf_vocab) {
  const ResolvedRow row = resolve_row(family_of(c), name, c);
  if (c.layernorm_zero_centered_gamma && is_norm_weight(name)) {
    // The scale HF applies, rounded once to the stored dtype.
    return {{row.hf.at(0), (full.to(at::kFloat) + 1.0).to(full.scalar_type())}};
  }
  const std::vector<std::string>& names = row.hf;
  switch (row.rule->transform) {
    case HfTransform::Copy: return {{names[0], full}};
    case HfTransform::VocabRows: return {{names[0], full.narrow(0, 0, hf_vocab)}};
    case HfTransform::GateUp: {
      auto halves = full.chunk(2, 0);
      return {{names[0], halves[0]}, {names[1], halves[1]}};
    }
    case HfTransform::QkvFused: {
      const int64_t H = c.num_attention_heads, G = c.num_query_groups, d = c.kv_channels;
      const int64_t cols = full.dim() == 2 ? full.size(1) : 1;
      auto parts = full.reshape({G, (H / G + 2) * d, cols}).split_with_sizes({H / G * d, d, d}, 1);
      auto shaped = [&](const at::Tensor& t, int64_t rows) {
        return full.dim() == 2 ? t.reshape({rows, cols}) : t.reshape({rows});
      };
      return {{names[0], shaped(parts[0], H * d)}, {names[1], shaped(parts[1], G * d)}, {names[2], shaped(parts[2], G * d)}};
    }
  }
  TORCH_CHECK(false, "unknown HfTransform");
}

void adopt_hf_architecture(Config& config) {
  const std::string& dir = config.train.load_hf;
  const ModelConfig hf = model_config_from_hf(dir, config.model.family);
  auto given = [&](const char* flag) { return config.explicit_flags.count(flag) > 0; };
  const ModelConfig user = adopt_architecture(config, hf, dir + "/config.json", "--load-hf");
  ModelConfig& m = config.model;
  m.hf_vocab_size = hf.vocab_size;
  m.vocab_size = user.vocab_size;  // the tokenizer's, settled by finalize_config
  // How the norms' weights are stored is the run's choice; the conversion shifts them.
  m.layernorm_zero_centered_gamma = user.layernorm_zero_centered_gamma;
  m.mtp_num_layers = user.mtp_num_layers;  // HF keeps no MTP depths: building one is the run's choice
  m.mtp_loss_scaling_factor = user.mtp_loss_scaling_factor;
  DataConfig& d = config.data;
  if (!given("tokenizer-type") && !given("tokenizer-model") && fs::exists(dir + "/tokenizer.json")) {
    d.tokenizer_type = "HuggingFaceTokenizer";
    d.tokenizer_model = dir;
  }
}

int64_t load_hf_weights(const std::string& dir, GPTModel& model) { return load_hf_weights(dir, std::vector<GPTModel*>{&model}); }

int64_t load_hf_weights(const std::string& dir, const std::vector<GPTModel*>& chunks) {
  at::NoGradGuard no_grad;
  HfCheckpointReader hf(dir);
  int64_t left = 0;  // multi-token prediction parameters the checkpoint lacks
  for (GPTModel* model : chunks) {
    const tp::TensorParallel& tp = model->tensor_parallel();
    for (auto& item : model->named_parameters()) {
      const std::string& name = item.key();
      at::Tensor& param = item.value();
      if (name.rfind("mtp.", 0) == 0 && !hf.has(resolve_row(family_of(model->config()), name, model->config()).hf[0])) {
        ++left;  // HF transformers keeps no MTP weights: the depth starts from its initialisation
        continue;
      }
      const tp::ParamInfo& info = model->parameter_table().at(name);
      const dist::Group& split = tp.split_group(info);  // experts: over expert TP
      std::vector<int64_t> full_shape = param.sizes().vec();  // this rank's shard, grown back to the whole
      if (!info.split.replicated()) full_shape[size_t(info.split.dim)] *= split.size();
      const at::Tensor full = megatron_tensor_from_hf(name, model->config(), hf, full_shape);
      // Every HF tensor was checked against full_shape, so the shard is this parameter's shape.
      param.copy_(tp::shard_of(full, info.split, split.rank(), split.size()));
    }
  }
  // A pipeline stage uses only its own layers' tensors.
  const bool whole_model = chunks.size() == 1 && chunks[0]->chunk().num_layers == chunks[0]->config().num_layers &&
                           chunks[0]->tensor_parallel().experts.size() == 1;  // under EP a rank holds its experts only
  if (whole_model) {
    ignore_unbuilt_hf_layers(hf, chunks[0]->config());
    hf.check_all_used();
  }
  return left;
}

}  // namespace megatron
