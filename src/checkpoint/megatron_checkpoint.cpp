#include "checkpoint/megatron_checkpoint.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "core/errors.h"
#include "core/files.h"

namespace megatron {
namespace fs = std::filesystem;
namespace {

using pickle::Value;

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

// The routed experts' tensors, stacked over experts in torch_dist:
// "<layer>.mlp.experts.experts.<linear>.<param>".
const std::string kStackedExperts = ".mlp.experts.experts.";

// Our name for the stored torch_dist tensor `key` at `index` along its stacked axes: a stack over
// layers ("decoder.layers.<rest>") gets its layer, one over experts its expert after the
// parameter's name, as the TE spec's GroupedMLP names them (".mlp.experts.linear_fc1.weight3").
std::string dist_member_name(const std::string& key, bool layer_stacked, bool expert_stacked, const std::vector<int64_t>& index) {
  std::string name = key;
  size_t next = 0;
  if (layer_stacked) name.insert(std::string("decoder.layers.").size(), std::to_string(index[next++]) + ".");
  if (expert_stacked) {
    const size_t at = name.find(kStackedExperts);
    name = name.substr(0, at) + ".mlp.experts." + name.substr(at + kStackedExperts.size()) + std::to_string(index[next]);
  }
  return name;
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
  } else if (std::any_of(fs::directory_iterator(dir_), fs::directory_iterator(),
                         [](const fs::directory_entry& e) { return e.path().filename().string().rfind("mp_rank_", 0) == 0; })) {
    format_ = Format::Legacy;  // one mp_rank_* directory per model-parallel rank
    open_legacy();
  } else {
    throw UserError(dir_ + ": neither a torch_dist checkpoint (.metadata) nor a legacy one (mp_rank_*/model_optim_rng.pt)");
  }
}

MegatronCheckpoint::~MegatronCheckpoint() = default;

bool MegatronCheckpoint::is_model_tensor(const std::string& name) {
  if (name.find("_extra_state") != std::string::npos) return false;
  for (const char* prefix : {"embedding.", "decoder.", "output_layer.", "mtp."}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

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
    // Homogeneous layers are saved as one tensor over all of them, [L, ...]; the routed experts
    // as one over experts, [E, ...], after the layers' axis when that is there.
    const bool layer_stacked = key.rfind(layers, 0) == 0 && !std::isdigit(static_cast<unsigned char>(key[layers.size()]));
    const bool expert_stacked = key.find(kStackedExperts) != std::string::npos;
    const size_t stacked = size_t(layer_stacked) + size_t(expert_stacked);
    if (t.size.size() < stacked) throw UserError(metadata_path + ": " + key + " has fewer dimensions than the layers or experts it stacks");
    if (layer_stacked && num_layers_ > 0 && t.size[0] != num_layers_) {
      throw UserError(metadata_path + ": " + key + " has first dimension " + std::to_string(t.size[0]) + ", expected the " +
                      std::to_string(num_layers_) + " layers it stacks");
    }
    // One name per member some chunk holds (a stack over layers may hold only the MoE ones).
    std::set<std::vector<int64_t>> members;
    for (const Chunk& c : t.chunks) {
      std::vector<int64_t> index(stacked);
      std::function<void(size_t)> each = [&](size_t d) {
        if (d == stacked) return void(members.insert(index));
        for (index[d] = c.offsets[d]; index[d] < c.offsets[d] + c.sizes[d]; ++index[d]) each(d + 1);
      };
      each(0);
    }
    for (const std::vector<int64_t>& index : members) {
      sources_[dist_member_name(key, layer_stacked, expert_stacked, index)] = {key, index};
    }
  }
  for (const auto& [name, source] : sources_) names_.push_back(name);
}

const pickle::Value& MegatronCheckpoint::args() const {
  const Value* args = common_ ? common_->root().get("args") : nullptr;
  if (args == nullptr) throw UserError(dir_ + ": the checkpoint holds no 'args' (the saving run's arguments), which give the model's shape");
  return *args;
}

bool MegatronCheckpoint::has(const std::string& name) const { return sources_.count(name) > 0; }

at::Tensor MegatronCheckpoint::read_dist(const std::string& key, const std::vector<int64_t>& index) const {
  const DistTensor& t = stored_.at(key);
  const size_t lead = index.size();
  const std::vector<int64_t> shape(t.size.begin() + long(lead), t.size.end());
  at::Tensor out;
  int64_t filled = 0;
  for (const Chunk& c : t.chunks) {
    bool holds = true;
    for (size_t d = 0; d < lead; ++d) holds = holds && index[d] >= c.offsets[d] && index[d] < c.offsets[d] + c.sizes[d];
    if (!holds) continue;
    const std::string file = dir_ + "/" + c.file;
    TorchSaveFile item(read_range(file, c.byte_offset, c.byte_length), file + " at byte " + std::to_string(c.byte_offset));
    at::Tensor part = item.tensor(item.root());
    if (part.sizes().vec() != c.sizes) throw UserError(file + ": a chunk of shape " + c10::str(part.sizes()) + " where .metadata says " + c10::str(c.sizes));
    for (size_t d = 0; d < lead; ++d) part = part.select(0, index[d] - c.offsets[d]);  // the member's slice of the chunk
    if (!out.defined()) out = at::empty(shape, part.options());
    at::Tensor into = out;
    for (size_t d = lead; d < c.offsets.size(); ++d) into = into.narrow(int64_t(d - lead), c.offsets[d], c.sizes[d]);
    into.copy_(part);
    filled += part.numel();
  }
  // Chunks do not overlap; fewer elements than the tensor holds would leave some unread.
  if (!out.defined() || filled != out.numel()) {
    throw UserError(dir_ + "/.metadata: the chunks of " + key + (lead ? " at " + c10::str(index) : std::string()) + " cover " +
                    std::to_string(filled) + " of its " + std::to_string(out.defined() ? out.numel() : c10::multiply_integers(shape)) +
                    " elements");
  }
  return out;
}

at::Tensor MegatronCheckpoint::tensor(const std::string& name, int part) const {
  auto it = sources_.find(name);
  if (it == sources_.end()) throw UserError(dir_ + ": the checkpoint has no tensor '" + name + "'");
  const Source& s = it->second;
  if (format_ == Format::Legacy) {
    const TorchSaveFile& file = legacy_file(part, s.stage, s.expert_rank);
    const std::string model = s.chunk < 0 ? "model" : "model" + std::to_string(s.chunk);
    const Value* value = file.root().at(model).get(s.key);
    if (value == nullptr) {
      throw UserError(dir_ + ": tensor-parallel rank " + std::to_string(part) + "'s file of stage " + std::to_string(s.stage) + " has no '" +
                      s.key + "' in '" + model + "'");
    }
    return file.tensor(*value);
  }
  return read_dist(s.key, s.index);
}

std::string megatron_source_name(const MegatronCheckpoint& checkpoint, const std::string& name) {
  if (checkpoint.has(name)) return name;
  // The local layer spec keeps the norms as modules of the layer; the TE spec (ours) in the
  // linears (MLA's latent norms too). An MoE layer has no linear_fc1 to hold its pre-MLP norm
  // (ours is a module), but the local spec's torch_dist keys put it there all the same.
  static const std::pair<const char*, const char*> renames[] = {
      {".self_attention.linear_qkv.layer_norm_weight", ".input_layernorm.weight"},
      {".self_attention.linear_qkv.layer_norm_bias", ".input_layernorm.bias"},
      {".mlp.linear_fc1.layer_norm_weight", ".pre_mlp_layernorm.weight"},
      {".mlp.linear_fc1.layer_norm_bias", ".pre_mlp_layernorm.bias"},
      {".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight"},
      {".pre_mlp_layernorm.bias", ".mlp.linear_fc1.layer_norm_bias"},
      {".self_attention.linear_q_up_proj.layer_norm_weight", ".self_attention.q_layernorm.weight"},
      {".self_attention.linear_kv_up_proj.layer_norm_weight", ".self_attention.kv_layernorm.weight"}};
  for (const auto& [ours, local] : renames) {
    const std::string tail = ours;
    if (name.size() > tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0) {
      const std::string candidate = name.substr(0, name.size() - tail.size()) + local;
      if (checkpoint.has(candidate)) return candidate;
    }
  }
  return "";
}

}  // namespace megatron
