#include "checkpoint/tensor_table.h"

#include "checkpoint/safetensors.h"
#include "tensor_parallel/sharding.h"

namespace megatron {

nlohmann::json describe_files(const std::vector<CheckpointSnapshot::File>& files, const tp::ParamTable& params, int tp_rank,
                              int tp_size, int expert_tp_rank, int expert_tp_size) {
  if (expert_tp_size < 0) expert_tp_rank = tp_rank, expert_tp_size = tp_size;
  auto is_expert = [&](const std::string& param) { return params.contains(param) && params.at(param).expert >= 0; };
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : files) {
    const bool model = f.name.rfind("model", 0) == 0, optimizer = f.name.rfind("optimizer", 0) == 0;
    if (!model && !optimizer) continue;
    nlohmann::json tensors = nlohmann::json::object();
    for (const auto& entry : f.tensors) {
      const at::Tensor& t = entry.tensor;
      if (model) {
        const tp::ShardSpec spec = params.at(entry.name).split;
        const bool expert = is_expert(entry.name);
        tensors[entry.name] = {{"shape", tp::full_shape(t.sizes(), spec, expert ? expert_tp_size : tp_size)},
                               {"dtype", safetensors_dtype_name(t.scalar_type())},
                               {"split_dim", spec.replicated() ? nlohmann::json() : nlohmann::json(spec.dim)},
                               {"gated", spec.gated}};
        if (expert) tensors[entry.name].update({{"tp_rank", expert_tp_rank}, {"tp_size", expert_tp_size}});
      } else if (entry.name != "step") {
        // "<param>.<field>": the offset of this slice in the flattened TP shard.
        const std::string param = entry.name.substr(0, entry.name.rfind('.'));
        auto it = f.metadata.find("offset/" + param);
        tensors[entry.name] = {{"offset", it == f.metadata.end() ? int64_t(0) : std::stoll(it->second)}, {"numel", t.numel()}};
        if (is_expert(param)) tensors[entry.name].update({{"tp_rank", expert_tp_rank}, {"tp_size", expert_tp_size}});
      }
    }
    out.push_back({{"file", f.name}, {"kind", model ? "model" : "optimizer"}, {"tp_rank", tp_rank}, {"tp_size", tp_size},
                   {"tensors", tensors}});
  }
  return out;
}

nlohmann::json merge_file_descriptions(const std::vector<nlohmann::json>& descriptions) {
  nlohmann::json tensors = nlohmann::json::object(), optimizer = nlohmann::json::object();
  for (const auto& rank_files : descriptions) {
    for (const auto& f : rank_files) {
      const bool model = f.at("kind") == "model";
      nlohmann::json& table = model ? tensors : optimizer;
      for (const auto& [name, info] : f.at("tensors").items()) {
        nlohmann::json& entry = table[name];
        // A tensor's own split (experts: over expert TP) where it names one, else the file's.
        const nlohmann::json tp_rank = info.value("tp_rank", f.at("tp_rank")), tp_size = info.value("tp_size", f.at("tp_size"));
        nlohmann::json part = {{"file", f.at("file")}, {"tp_rank", tp_rank}};
        if (model) {
          if (entry.is_null()) {
            entry = info;
            entry.erase("tp_rank");
            entry["tp_size"] = tp_size;
            entry["files"] = nlohmann::json::array();
          }
        } else {
          if (entry.is_null()) entry = {{"tp_size", tp_size}, {"files", nlohmann::json::array()}};
          part["offset"] = info.at("offset");
          part["numel"] = info.at("numel");
        }
        entry["files"].push_back(part);
      }
    }
  }
  return {{"tensors", tensors}, {"optimizer_tensors", optimizer}};
}

std::string table_file_of(const nlohmann::json& state, const std::string& name, int tp_rank) {
  auto tensors = state.find("tensors");
  if (tensors == state.end() || !tensors->contains(name)) return "";
  for (const auto& part : (*tensors)[name].at("files")) {
    if (part.at("tp_rank") == tp_rank) return part.at("file").get<std::string>();
  }
  return "";
}

}  // namespace megatron
