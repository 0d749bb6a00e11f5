// `megatron train --help`: the flag table by Megatron-LM's argument groups, each flag's default,
// and the rest of Megatron's flags by what happens to them here.
#include <map>
#include <sstream>
#include <string>

#include "model/families.h"
#include "train/arguments.h"
#include "train/megatron_flags.h"
#include "train/train_flags.h"

namespace megatron {

namespace {

// A list's values, space-separated.
template <typename T>
std::string joined(const void* target) {
  std::ostringstream v;
  for (const T& x : *static_cast<const std::vector<T>*>(target)) v << (v.tellp() > 0 ? " " : "") << x;
  return v.str();
}

// The default a flag's field holds, as help shows it ("" for none worth showing: switches, zero,
// empty, and the negative "not given" markers).
std::string default_text(const TrainFlag& f) {
  std::ostringstream v;
  switch (f.kind) {
    case FlagKind::Int: if (*static_cast<int*>(f.target) > 0) v << *static_cast<int*>(f.target); break;
    case FlagKind::Int64: if (*static_cast<int64_t*>(f.target) > 0) v << *static_cast<int64_t*>(f.target); break;
    case FlagKind::Double: if (*static_cast<double*>(f.target) > 0) v << *static_cast<double*>(f.target); break;
    case FlagKind::String: v << *static_cast<std::string*>(f.target); break;
    case FlagKind::StringList: return joined<std::string>(f.target);
    case FlagKind::IntList: return joined<int>(f.target);
    case FlagKind::DoubleList: return joined<double>(f.target);
    case FlagKind::Bool:
    case FlagKind::NegatedBool:
    case FlagKind::Preset: break;
  }
  return v.str();
}

// Where each group of the table starts, named after Megatron-LM's argument groups.
const std::map<std::string, const char*>& help_groups() {
  static const std::map<std::string, const char*> groups = {
      {"num-layers", "network size"},
      {"position-embedding-type", "position embedding"},
      {"multi-latent-attention", "multi-latent attention"},
      {"mtp-num-layers", "multi-token prediction"},
      {"untie-embeddings-and-output-weights", "output layer, initialization, regularization"},
      {"no-rope-fusion", "fusions and activation recomputation"},
      {"num-experts", "mixture of experts"},
      {"tensor-model-parallel-size", "distributed"},
      {"data-path", "data and dataloader"},
      {"tokenizer-type", "tokenizer"},
      {"micro-batch-size", "training"},
      {"lr", "learning rate"},
      {"weight-decay", "optimizer"},
      {"bf16", "mixed precision and seed"},
      {"log-interval", "logging"},
      {"eval-interval", "validation"},
      {"profile", "profiling and metrics"},
      {"save", "checkpointing"},
      {"cuda-graph-impl", "CUDA graphs"},
      {"device", "device"}};
  return groups;
}

}  // namespace

std::string train_help() {
  Config defaults;
  auto flags = train_flags(defaults);
  std::ostringstream out;
  out << "usage: megatron train [--config recipe.yaml] [--model-family NAME] [flags]\n"
         "       megatron pretrain_gpt.py ARGS   (a Megatron-LM or Pai-Megatron-Patch launch script's arguments)\n\n"
         "Trains a GPT-style model. Flags take Megatron-LM's names; a recipe takes the same keys\n"
         "without the dashes, and flags given here override it. Example:\n"
         "  megatron train --config examples/tiny_cpu.yaml --mock-data --train-iters 20\n"
         "  torchrun --nproc-per-node 8 --no-python megatron pretrain_gpt.py --num-layers 32 ... (unchanged)\n\n"
         "  --config FILE                     YAML recipe\n"
         "  --model-family NAME               preset:";
  for (const auto& name : known_model_families()) out << " " << name;
  out << "\n";
  for (const auto& f : flags) {
    if (auto group = help_groups().find(f.name); group != help_groups().end()) out << "\n" << group->second << ":\n";
    std::string left = "  --" + f.name;
    if (f.kind != FlagKind::Bool && f.kind != FlagKind::NegatedBool && f.kind != FlagKind::Preset) left += f.kind == FlagKind::StringList || f.kind == FlagKind::IntList || f.kind == FlagKind::DoubleList ? " V..." : " V";
    if (left.size() < 36) left.resize(36, ' ');
    const std::string fallback = default_text(f);
    out << left << " " << f.help << (fallback.empty() ? "" : " [default: " + fallback + "]") << "\n";
  }
  // The rest of Megatron-LM's and Pai-Megatron-Patch's flags, so that a launch script's whole
  // argument list is understood: those accepted without effect and those refused for now.
  auto list = [&](MegatronFlag::Fate fate, const char* title) {
    out << "\n" << title << "\n ";
    size_t column = 1;
    for (const auto& f : megatron_flags()) {
      if (f.fate != fate) continue;
      const std::string word = std::string(" --") + f.name;
      if (column + word.size() > 100) out << "\n ", column = 1;
      out << word;
      column += word.size();
    }
    out << "\n";
  };
  list(MegatronFlag::Fate::Ignored, "Megatron flags accepted with a notice, without effect here (a kernel, service or format choice):");
  list(MegatronFlag::Fate::NotYet,
       "Megatron flags not implemented yet: refused with what to use instead, unless given Megatron's default value:");
  return out.str();
}

}  // namespace megatron
