#include "checkpoint/megatron_checkpoint.h"

#include <ATen/ATen.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/errors.h"
#include "core/files.h"

namespace megatron {
namespace fs = std::filesystem;
namespace {

using pickle::Value;

// The model's tensors among everything a torch_dist checkpoint holds (optimizer state, RNG
// states and Transformer Engine's _extra_state are left out).
bool is_model_tensor(const std::string& name) {
  if (name.find("_extra_state") != std::string::npos) return false;
  for (const char* prefix : {"embedding.", "decoder.", "output_layer.", "mtp."}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

std::vector<int64_t> ints(const Value& v) {
  std::vector<int64_t> out;
  for (const auto& item : v.items) out.push_back(item->as_int());
  return out;
}

std::string read_range(const std::string& path, int64_t offset, int64_t length) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot open (a file the checkpoint's .metadata names)");
  std::string bytes(size_t(length), '\0');
  in.seekg(offset);
  in.read(bytes.data(), length);
  if (in.gcount() != length) {
    throw UserError(path + ": truncated: " + std::to_string(length) + " bytes at offset " + std::to_string(offset) + " are not all there");
  }
  return bytes;
}

// The iteration directory `path` names: itself, or what its tracker file points at.
std::string iteration_directory(const std::string& path, int64_t* iteration) {
  const std::string tracker = path + "/latest_checkpointed_iteration.txt";
  if (fs::exists(tracker)) {
    std::string text = read_file(tracker);
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    if (text == "release") return path + "/release";
    char* end = nullptr;
    const long long it = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || it < 0) throw UserError(tracker + ": expected an iteration number or 'release', found '" + text + "'");
    *iteration = it;
    char name[32];
    std::snprintf(name, sizeof(name), "/iter_%07lld", it);
    return path + name;
  }
  const std::string base = fs::path(path).filename().string();
  if (base.rfind("iter_", 0) == 0) *iteration = std::strtoll(base.c_str() + 5, nullptr, 10);
  return path;
}

}  // namespace

MegatronCheckpoint::MegatronCheckpoint(const std::string& path) {
  if (!fs::is_directory(path)) throw UserError(path + ": no such directory (a Megatron --save directory or one of its iter_* directories)");
  dir_ = iteration_directory(path, &iteration_);
  if (fs::exists(dir_ + "/.metadata")) {
    format_ = Format::TorchDist;
    open_torch_dist();
  } else if (fs::exists(dir_ + "/mp_rank_00/model_optim_rng.pt") || fs::exists(dir_ + "/mp_rank_00_000")) {
    format_ = Format::Legacy;
    open_legacy();
  } else {
    throw UserError(dir_ + ": neither a torch_dist checkpoint (.metadata) nor a legacy one (mp_rank_00/model_optim_rng.pt)");
  }
}

MegatronCheckpoint::~MegatronCheckpoint() = default;

void MegatronCheckpoint::open_torch_dist() {
  const std::string metadata_path = dir_ + "/.metadata";
  pickle::ValuePtr metadata;
  try {
    metadata = pickle::parse(read_file(metadata_path));
  } catch (const std::exception& e) {
    throw UserError(metadata_path + ": " + e.what());
  }
  try {
    // Metadata.state_dict_metadata: name -> TensorStorageMetadata(properties, size, chunks).
    for (const auto& [key, info] : metadata->at("state_dict_metadata").entries) {
      if (!info->is_object_of("torch.distributed.checkpoint.metadata", "TensorStorageMetadata")) continue;  // bytes items
      if (!is_model_tensor(key->text)) continue;
      DistTensor t;
      t.size = ints(info->at("size"));
      for (const auto& chunk : info->at("chunks").items) t.chunks.push_back({ints(chunk->at("offsets")), ints(chunk->at("sizes"))});
      stored_.emplace(key->text, std::move(t));
    }
    // Metadata.storage_data: MetadataIndex(fqn, offset) -> _StorageInfo(relative_path, offset, length).
    for (const auto& [index, where] : metadata->at("storage_data").entries) {
      auto it = stored_.find(index->at("fqn").text);
      if (it == stored_.end()) continue;
      const std::vector<int64_t> offsets = ints(index->at("offset"));
      const Value* transforms = where->get("transform_descriptors");
      if (transforms != nullptr && !transforms->items.empty()) {
        throw UserError(metadata_path + ": " + it->first + " is stored transformed (" + transforms->items[0]->text +
                        "), which this reader does not undo");
      }
      for (Chunk& c : it->second.chunks) {
        if (c.offsets != offsets) continue;
        c.file = where->at("relative_path").text;
        c.byte_offset = where->at("offset").as_int();
        c.byte_length = where->at("length").as_int();
      }
    }
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const UserError*>(&e) != nullptr) throw;
    throw UserError(metadata_path + ": not the Metadata of PyTorch distributed checkpointing: " + e.what());
  }
  if (fs::exists(dir_ + "/common.pt")) common_ = std::make_unique<TorchSaveFile>(dir_ + "/common.pt");
  if (common_ && common_->root().get("args") && common_->root().at("args").get("num_layers")) {
    num_layers_ = common_->root().at("args").at("num_layers").as_int();
  }
  for (const auto& [key, t] : stored_) {
    for (const Chunk& c : t.chunks) {
      if (c.file.empty()) throw UserError(metadata_path + ": no storage entry for a chunk of " + key);
    }
    const std::string layers = "decoder.layers.";
    const bool stacked = key.rfind(layers, 0) == 0 && !std::isdigit(static_cast<unsigned char>(key[layers.size()]));
    if (!stacked) {
      sources_[key] = {key, -1};
      continue;
    }
    // Homogeneous layers are saved as one tensor over all of them: [L, ...].
    if (num_layers_ > 0 && (t.size.empty() || t.size[0] != num_layers_)) {
      throw UserError(metadata_path + ": " + key + " has first dimension " + (t.size.empty() ? std::string("none") : std::to_string(t.size[0])) +
                      ", expected the " + std::to_string(num_layers_) + " layers it stacks");
    }
    for (int64_t l = 0; l < t.size.at(0); ++l) sources_[layers + std::to_string(l) + "." + key.substr(layers.size())] = {key, l};
  }
  for (const auto& [name, source] : sources_) names_.push_back(name);
}

void MegatronCheckpoint::open_legacy() {
  // mp_rank_XX per tensor-parallel rank; mp_rank_XX_YYY when pipeline stages are saved apart.
  int ranks = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("mp_rank_", 0) != 0) continue;
    if (name.size() != 10) {
      throw UserError(dir_ + ": a legacy checkpoint saved over pipeline stages (" + name + "), which is not read yet: save it with "
                      "--ckpt-format torch_dist (the default), or with --pipeline-model-parallel-size 1");
    }
    ++ranks;
  }
  for (int r = 0; r < ranks; ++r) {
    char name[32];
    std::snprintf(name, sizeof(name), "/mp_rank_%02d/model_optim_rng.pt", r);
    if (!fs::exists(dir_ + name)) throw UserError(dir_ + ": " + std::string(name + 1) + " is missing (" + std::to_string(ranks) + " ranks saved)");
    legacy_.push_back(std::make_unique<TorchSaveFile>(dir_ + name));
  }
  const std::string path = dir_ + "/mp_rank_00/model_optim_rng.pt";
  common_ = std::make_unique<TorchSaveFile>(path);
  if (const Value* tp = common_->root().get("args") ? common_->root().at("args").get("tensor_model_parallel_size") : nullptr;
      tp != nullptr && tp->kind == Value::Kind::Int && tp->integer != ranks) {
    throw UserError(dir_ + ": " + std::to_string(ranks) + " mp_rank_* directories, but the run saved " + std::to_string(tp->integer) +
                    " tensor-parallel ranks");
  }
  const Value* model = common_->root().get("model");
  if (model == nullptr) {
    throw UserError(path + ": no 'model' state dict" + (common_->root().get("model0") ? " (it holds virtual pipeline chunks model0, model1, ...: not read yet)" : ""));
  }
  for (const auto& [key, value] : model->entries) {
    if (!TorchSaveFile::is_tensor(*value) || !is_model_tensor(key->text)) continue;  // _extra_state and the like
    sources_[key->text] = {key->text, -1};
    names_.push_back(key->text);
  }
}

const pickle::Value& MegatronCheckpoint::args() const {
  const Value* args = common_ ? common_->root().get("args") : nullptr;
  if (args == nullptr) throw UserError(dir_ + ": the checkpoint holds no 'args' (the saving run's arguments), which give the model's shape");
  return *args;
}

bool MegatronCheckpoint::has(const std::string& name) const { return sources_.count(name) > 0; }

at::Tensor MegatronCheckpoint::read_dist(const DistTensor& t, int64_t layer) const {
  std::vector<int64_t> shape = t.size;
  if (layer >= 0) shape[0] = 1;
  at::Tensor out;
  for (const Chunk& c : t.chunks) {
    if (layer >= 0 && (layer < c.offsets[0] || layer >= c.offsets[0] + c.sizes[0])) continue;
    const std::string file = dir_ + "/" + c.file;
    TorchSaveFile item(read_range(file, c.byte_offset, c.byte_length), file + " at byte " + std::to_string(c.byte_offset));
    at::Tensor part = item.tensor(item.root());
    if (part.sizes().vec() != c.sizes) throw UserError(file + ": a chunk of shape " + c10::str(part.sizes()) + " where .metadata says " + c10::str(c.sizes));
    if (!out.defined()) out = at::empty(shape, part.options());
    at::Tensor into = out;
    for (size_t d = 0; d < c.offsets.size(); ++d) {
      if (d == 0 && layer >= 0) {
        part = part.narrow(0, layer - c.offsets[0], 1);  // the layer's slice of the chunk; `into` keeps its one row
        continue;
      }
      into = into.narrow(int64_t(d), c.offsets[d], c.sizes[d]);
    }
    into.copy_(part);
  }
  if (!out.defined()) throw UserError(dir_ + "/.metadata: no chunk holds layer " + std::to_string(layer) + " of a stacked tensor");
  return layer >= 0 ? out[0] : out;
}

at::Tensor MegatronCheckpoint::tensor(const std::string& name, int part) const {
  auto it = sources_.find(name);
  if (it == sources_.end()) throw UserError(dir_ + ": the checkpoint has no tensor '" + name + "'");
  const Source& s = it->second;
  if (format_ == Format::Legacy) {
    const TorchSaveFile& file = *legacy_.at(size_t(part));
    const Value* value = file.root().at("model").get(s.key);
    if (value == nullptr) throw UserError(dir_ + ": tensor-parallel rank " + std::to_string(part) + "'s file has no '" + s.key + "'");
    return file.tensor(*value);
  }
  return read_dist(stored_.at(s.key), s.layer);
}

std::string megatron_source_name(const MegatronCheckpoint& checkpoint, const std::string& name) {
  if (checkpoint.has(name)) return name;
  // The local layer spec keeps the norms as modules of the layer; the TE spec (ours) in the linears.
  static const std::pair<const char*, const char*> renames[] = {
      {".self_attention.linear_qkv.layer_norm_weight", ".input_layernorm.weight"},
      {".self_attention.linear_qkv.layer_norm_bias", ".input_layernorm.bias"},
      {".mlp.linear_fc1.layer_norm_weight", ".pre_mlp_layernorm.weight"},
      {".mlp.linear_fc1.layer_norm_bias", ".pre_mlp_layernorm.bias"}};
  for (const auto& [ours, local] : renames) {
    const std::string tail = ours;
    if (name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0) {
      const std::string candidate = name.substr(0, name.size() - tail.size()) + local;
      if (checkpoint.has(candidate)) return candidate;
    }
  }
  return "";
}

ModelConfig model_config_from_megatron_args(const pickle::Value& args, const std::string& what) {
  auto get = [&](const char* name) -> const Value* {
    const Value* v = args.get(name);
    return v == nullptr || v->kind == Value::Kind::None ? nullptr : v;
  };
  auto integer = [&](const char* name, int64_t fallback) { const Value* v = get(name); return v ? v->as_int() : fallback; };
  auto number = [&](const char* name, double fallback) { const Value* v = get(name); return v ? v->as_number() : fallback; };
  auto flag = [&](const char* name, bool fallback) { const Value* v = get(name); return v ? v->as_int() != 0 : fallback; };
  auto text = [&](const char* name, const std::string& fallback) {
    const Value* v = get(name);
    return v && v->kind == Value::Kind::String ? v->text : fallback;
  };
  auto refuse = [&](const std::string& arg, const std::string& why) {
    throw UserError(what + ": the checkpoint's run used --" + arg + ", " + why);
  };
  if (integer("num_experts", 0) > 0) refuse("num-experts", "a mixture of experts, which convert --from megatron does not read yet");
  if (flag("multi_latent_attention", false)) refuse("multi-latent-attention", "which convert --from megatron does not read yet");
  if (integer("mtp_num_layers", 0) > 0) refuse("mtp-num-layers", "which convert --from megatron does not read yet");
  ModelConfig m;
  for (const char* required : {"num_layers", "hidden_size", "num_attention_heads", "padded_vocab_size"}) {
    if (get(required) == nullptr) throw UserError(what + ": the checkpoint's args lack '" + std::string(required) + "'");
  }
  m.num_layers = int(integer("num_layers", 0));
  m.hidden_size = int(integer("hidden_size", 0));
  m.num_attention_heads = int(integer("num_attention_heads", 0));
  m.ffn_hidden_size = int(integer("ffn_hidden_size", 4 * m.hidden_size));
  m.group_query_attention = flag("group_query_attention", false);
  m.num_query_groups = m.group_query_attention ? int(integer("num_query_groups", m.num_attention_heads)) : m.num_attention_heads;
  m.kv_channels = int(integer("kv_channels", m.hidden_size / m.num_attention_heads));
  m.seq_length = int(integer("seq_length", 2048));
  m.max_position_embeddings = int(integer("max_position_embeddings", m.seq_length));
  m.padded_vocab_size = int(integer("padded_vocab_size", 0));
  m.vocab_size = m.padded_vocab_size;
  m.padded_vocab_size_flag = m.padded_vocab_size;
  m.make_vocab_size_divisible_by = int(integer("make_vocab_size_divisible_by", 128));
  m.normalization = text("normalization", "LayerNorm");
  m.norm_epsilon = number("norm_epsilon", number("layernorm_epsilon", 1e-5));
  m.layernorm_zero_centered_gamma = flag("apply_layernorm_1p", false);
  m.swiglu = flag("swiglu", false);
  m.add_bias_linear = flag("add_bias_linear", true);
  m.add_qkv_bias = flag("add_qkv_bias", false);
  m.qk_layernorm = flag("qk_layernorm", false);
  m.untie_embeddings_and_output_weights = flag("untie_embeddings_and_output_weights", false);
  m.position_embedding_type = text("position_embedding_type", "learned_absolute");
  m.rotary_base = number("rotary_base", 10000.0);
  m.rotary_percent = number("rotary_percent", 1.0);
  m.rotary_seq_len_interpolation_factor = number("rotary_seq_len_interpolation_factor", 1.0);
  m.use_rope_scaling = flag("use_rope_scaling", false);
  m.rope_scaling_factor = number("rope_scaling_factor", 8.0);
  m.init_method_std = number("init_method_std", 0.02);
  m.hidden_dropout = number("hidden_dropout", 0.1);
  m.attention_dropout = number("attention_dropout", 0.1);
  return m;
}

}  // namespace megatron
