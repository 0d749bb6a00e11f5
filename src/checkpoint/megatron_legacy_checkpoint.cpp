// Megatron-LM's legacy checkpoints (--ckpt-format torch): one torch.save'd file per model-parallel
// rank, each holding that rank's part under its local names. Read here as one model under global
// names: layers renumbered across pipeline stages and virtual chunks, experts across
// expert-parallel ranks; tensor-parallel shards stay parts for the caller to join.
#include <filesystem>
#include <set>

#include "checkpoint/megatron_args.h"
#include "checkpoint/megatron_checkpoint.h"
#include "core/errors.h"

namespace megatron {
namespace fs = std::filesystem;
namespace {

using pickle::Value;

// A legacy state dict's routed-expert tensor under our name: its expert-parallel rank's local
// expert i (SequentialMLP "<layer>.mlp.experts.local_experts.<i>.<linear>.<param>", TEGroupedMLP
// "<layer>.mlp.experts.<linear>.<param><i>") becomes global expert first_expert + i. Empty for
// tensors outside the routed experts.
std::string legacy_expert_name(const std::string& key, int64_t first_expert, const std::string& file) {
  const std::string experts = ".mlp.experts.";
  const size_t at = key.find(experts);
  if (at == std::string::npos) return "";
  const std::string layer = key.substr(0, at + experts.size()), rest = key.substr(at + experts.size());
  const std::string local = "local_experts.";
  if (rest.rfind(local, 0) == 0) {
    const size_t dot = rest.find('.', local.size());
    const std::string digits = rest.substr(local.size(), dot - local.size());
    if (dot == std::string::npos || digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
      throw UserError(file + ": '" + key + "' does not name a local expert");
    }
    return layer + rest.substr(dot + 1) + std::to_string(first_expert + std::stoll(digits));
  }
  if (rest.rfind("linear_fc1.", 0) != 0 && rest.rfind("linear_fc2.", 0) != 0) {
    throw UserError(file + ": '" + key + "' is the legacy GroupedMLP's (--moe-use-legacy-grouped-gemm), which convert --from megatron "
                    "does not read: save the run with --ckpt-format torch_dist, which stores its experts one by one");
  }
  const size_t digits = rest.find_last_not_of("0123456789") + 1;
  if (digits == rest.size()) throw UserError(file + ": '" + key + "' names no expert (TEGroupedMLP's end in the expert's index)");
  return layer + rest.substr(0, digits) + std::to_string(first_expert + std::stoll(rest.substr(digits)));
}

const std::string kLayers = "decoder.layers.";

// The local layer index of a decoder layer's key ("decoder.layers.<i>.<...>"), -1 for others.
int64_t local_layer(const std::string& key) {
  if (key.rfind(kLayers, 0) != 0) return -1;
  const size_t dot = key.find('.', kLayers.size());
  const std::string digits = key.substr(kLayers.size(), dot - kLayers.size());
  if (dot == std::string::npos || digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

}  // namespace

const TorchSaveFile& MegatronCheckpoint::legacy_file(int tp_rank, int stage, int expert_rank) const {
  return *legacy_.at(size_t((tp_rank * legacy_pp_ + stage) * legacy_ep_ + expert_rank));
}

void MegatronCheckpoint::open_legacy() {
  // mp_rank_TT, then _PPP under pipeline parallelism and _EEE under expert parallelism (Megatron's
  // get_checkpoint_name); the saved args say which suffixes there are.
  std::set<std::string> ranks;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("mp_rank_", 0) == 0) ranks.insert(name);
  }
  const std::string first = *ranks.begin();  // mp_rank_00..., the first in name order
  const std::string path = dir_ + "/" + first + "/model_optim_rng.pt";
  if (!fs::exists(path)) throw UserError(dir_ + ": " + first + "/model_optim_rng.pt is missing");
  common_ = std::make_unique<TorchSaveFile>(path);
  const Value* args = common_->root().get("args");
  const int64_t pp = megatron_int_arg(args, "pipeline_model_parallel_size", 1, dir_);
  const int64_t ep = megatron_int_arg(args, "expert_model_parallel_size", 1, dir_);
  const std::string layout = "mp_rank_TT" + std::string(pp > 1 ? "_PPP" : "") + (ep > 1 ? "_EEE" : "");
  for (const std::string& name : ranks) {
    if (name.size() != layout.size()) {
      throw UserError(dir_ + ": " + name + " does not fit the saving run's layout (pipeline parallel " + std::to_string(pp) +
                      ", expert parallel " + std::to_string(ep) + " in its args: " + layout + ")");
    }
  }
  const int64_t tp = int64_t(ranks.size()) / (pp * ep);
  if (const int64_t saved = megatron_int_arg(args, "tensor_model_parallel_size", tp, dir_); saved * pp * ep != int64_t(ranks.size())) {
    throw UserError(dir_ + ": " + std::to_string(ranks.size()) + " mp_rank_* directories, but the run saved " + std::to_string(saved) +
                    " tensor-parallel ranks" + (pp > 1 ? " x " + std::to_string(pp) + " pipeline stages" : "") +
                    (ep > 1 ? " x " + std::to_string(ep) + " expert-parallel ranks" : ""));
  }
  const int64_t experts = megatron_int_arg(args, "num_experts", 0, dir_);
  if (experts > 0 && tp > 1) {
    throw UserError(dir_ + ": a legacy mixture-of-experts checkpoint saved under tensor parallelism (" + std::to_string(tp) +
                    " ranks), which is not read yet: save it with --ckpt-format torch_dist (the default)");
  }
  if (const Value* layout_arg = args ? args->get("pipeline_model_parallel_layout") : nullptr;
      layout_arg != nullptr && layout_arg->kind != Value::Kind::None) {
    throw UserError(dir_ + ": the run placed its layers by --pipeline-model-parallel-layout, which a legacy checkpoint does not record "
                    "per stage: save it with --ckpt-format torch_dist (the default)");
  }
  legacy_tp_ = int(tp), legacy_pp_ = int(pp), legacy_ep_ = int(ep);
  auto rank_file = [&](int64_t t, int64_t p, int64_t e) {
    char name[64];
    int n = std::snprintf(name, sizeof(name), "mp_rank_%02d", int(t));
    if (pp > 1) n += std::snprintf(name + n, sizeof(name) - size_t(n), "_%03d", int(p));
    if (ep > 1) std::snprintf(name + n, sizeof(name) - size_t(n), "_%03d", int(e));
    return std::string(name) + "/model_optim_rng.pt";
  };
  for (int64_t t = 0; t < tp; ++t) {
    for (int64_t p = 0; p < pp; ++p) {
      for (int64_t e = 0; e < ep; ++e) {
        const std::string name = rank_file(t, p, e);
        if (!fs::exists(dir_ + "/" + name)) throw UserError(dir_ + ": " + name + " is missing (" + std::to_string(ranks.size()) + " ranks saved)");
        legacy_.push_back(std::make_unique<TorchSaveFile>(dir_ + "/" + name));
      }
    }
  }
  // Virtual pipeline chunks are saved as model0, model1, ...; their layers follow chunk by chunk,
  // stage by stage within a chunk (chunk 0 of every stage, then chunk 1, ...), which is how
  // Megatron numbers them, even or uneven.
  const Value& stage0 = legacy_file(0, 0, 0).root();
  int chunks = 0;
  while (stage0.get("model" + std::to_string(chunks)) != nullptr) ++chunks;
  const bool chunked = chunks > 0;
  if (!chunked) {
    if (stage0.get("model") == nullptr) throw UserError(dir_ + "/" + rank_file(0, 0, 0) + ": no 'model' state dict");
    chunks = 1;
  }
  auto state_dict = [&](int64_t p, int64_t e, int c) -> const Value& {
    const std::string model = chunked ? "model" + std::to_string(c) : "model";
    const Value* v = legacy_file(0, int(p), int(e)).root().get(model);
    if (v == nullptr) throw UserError(dir_ + "/" + rank_file(0, p, e) + ": no '" + model + "' state dict (stage 0 has " + std::to_string(chunks) + ")");
    return *v;
  };
  std::vector<int64_t> first_layer(size_t(chunks * pp));  // [chunk][stage]: its first layer's global index
  int64_t layers = 0;
  for (int c = 0; c < chunks; ++c) {
    for (int64_t p = 0; p < pp; ++p) {
      first_layer[size_t(c * pp + p)] = layers;
      int64_t count = 0;
      for (const auto& [key, value] : state_dict(p, 0, c).entries) count = std::max(count, local_layer(key->text) + 1);
      layers += count;
    }
  }
  if (const int64_t saved = megatron_int_arg(args, "num_layers", layers, dir_); saved != layers) {
    throw UserError(dir_ + ": the stages' files hold " + std::to_string(layers) + " layers, the run's args say " + std::to_string(saved));
  }
  // With tied embeddings, the last stage keeps a copy of the word embeddings as its output layer.
  const Value* untie = args ? args->get("untie_embeddings_and_output_weights") : nullptr;
  const bool tied_copy = pp > 1 && (untie == nullptr || untie->kind == Value::Kind::None || untie->as_int() == 0);
  for (int c = 0; c < chunks; ++c) {
    for (int64_t p = 0; p < pp; ++p) {
      for (int64_t e = 0; e < ep; ++e) {
        const std::string file = dir_ + "/" + rank_file(0, p, e);
        for (const auto& [key_value, value] : state_dict(p, e, c).entries) {
          const std::string& key = key_value->text;
          if (!TorchSaveFile::is_tensor(*value) || !is_model_tensor(key)) continue;  // _extra_state and the like
          if (tied_copy && key == "output_layer.weight") continue;
          std::string name = key;
          if (const int64_t l = local_layer(key); l >= 0) {
            name = kLayers + std::to_string(first_layer[size_t(c * pp + p)] + l) + key.substr(key.find('.', kLayers.size()));
          }
          const std::string expert = experts > 0 ? legacy_expert_name(name, e * (experts / ep), file) : "";
          if (expert.empty() && e > 0) continue;  // the expert-parallel ranks' shared tensors: rank 0's
          name = expert.empty() ? name : expert;
          const Source source{key, {}, int(p), int(e), chunked ? c : -1};
          // The word embeddings also live on the stage that runs multi-token prediction.
          if (!sources_.emplace(name, source).second && name.rfind("embedding.", 0) != 0) {
            throw UserError(file + ": '" + key + "' is '" + name + "', which another stage's file holds too");
          }
        }
      }
    }
  }
  for (const auto& [name, source] : sources_) names_.push_back(name);
}

}  // namespace megatron
