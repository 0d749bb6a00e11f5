// Checkpoints Megatron-LM saved, read without Python (`megatron convert --from megatron`):
//  - torch_dist (Megatron-Core dist checkpointing): iter_XXXXXXX/.metadata (PyTorch distributed
//    checkpointing's pickled Metadata: each tensor's global shape and the chunks it was saved
//    in), the __R_I.distcp files (each chunk a torch.save'd tensor at a byte range) and common.pt
//    (the run's arguments). Tensors are global, whatever layout saved them; a layer's tensors
//    are stacked over layers ("decoder.layers.self_attention.linear_qkv.weight" [L, ...]) or
//    saved per layer ("decoder.layers.3.self_attention..."; Megatron does so when MoE and dense
//    layers mix); the routed experts' are stacked over experts too
//    ("decoder.layers.3.mlp.experts.experts.linear_fc1.weight" [E, 2f, h], SequentialMLP's and
//    TEGroupedMLP's alike).
//  - legacy: iter_XXXXXXX/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt, a torch.save'd dict with
//    "args" and the "model" state dict ("model0", "model1", ... for virtual pipeline chunks), one
//    file per tensor-parallel rank (TT), pipeline stage (PPP, its layers under local indices) and
//    expert-parallel rank (EEE, its own experts under local indices).
// Names come out as Megatron-Core's TE layer spec's, one tensor per layer and expert:
// "decoder.layers.3.<...>", "decoder.layers.3.mlp.experts.linear_fc1.weight<global expert>".
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/torch_save.h"

namespace megatron {

class MegatronCheckpoint {
 public:
  enum class Format { TorchDist, Legacy };

  // `path`: a --save directory (its latest_checkpointed_iteration.txt names the iteration) or an
  // iteration directory itself. UserError naming the path when it is neither format.
  explicit MegatronCheckpoint(const std::string& path);
  ~MegatronCheckpoint();

  Format format() const { return format_; }
  const std::string& directory() const { return dir_; }  // the iteration directory
  int64_t iteration() const { return iteration_; }
  // The saving run's arguments (its argparse.Namespace); UserError when the checkpoint has none.
  const pickle::Value& args() const;

  // The model's tensors, by Megatron-Core name (layers unstacked), and one of them whole
  // (torch_dist), or as rank `part`'s shard (legacy, one part per tensor-parallel rank; the
  // caller joins them by the model's split: tp::unshard).
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const;
  int parts() const { return format_ == Format::Legacy ? legacy_tp_ : 1; }
  at::Tensor tensor(const std::string& name, int part = 0) const;

 private:
  struct Chunk {
    std::vector<int64_t> offsets, sizes;
    std::string file;  // relative to dir_
    int64_t byte_offset = 0, byte_length = 0;
  };
  struct DistTensor {
    std::vector<int64_t> size;
    std::vector<Chunk> chunks;
  };
  struct Source {                // where a (layer's, expert's) tensor lives
    std::string key;             // torch_dist: the stored name; legacy: the state dict key
    std::vector<int64_t> index;  // torch_dist: its place along the stacked leading axes (layer, expert)
    int stage = 0;               // legacy: the pipeline stage and expert-parallel rank whose file holds it
    int expert_rank = 0;
    int chunk = -1;              // legacy: its virtual pipeline chunk ("model<chunk>"); -1: "model"
  };
  // The model's tensors among everything a checkpoint holds (optimizer state, RNG states and
  // Transformer Engine's _extra_state are left out).
  static bool is_model_tensor(const std::string& name);
  void open_torch_dist();
  void open_legacy();  // megatron_legacy_checkpoint.cpp
  const TorchSaveFile& legacy_file(int tp_rank, int stage, int expert_rank) const;
  // The stored tensor's slice at `index` along its leading (stacked) axes, the whole tensor for
  // none: only the chunks that hold it are read, so a stack is not read once per member.
  at::Tensor read_dist(const std::string& key, const std::vector<int64_t>& index) const;

  std::string dir_;
  Format format_ = Format::TorchDist;
  int64_t iteration_ = 0;
  std::unique_ptr<TorchSaveFile> common_;  // common.pt (torch_dist), or rank 0's model_optim_rng.pt (legacy)
  // legacy: every rank's file, [tensor-parallel rank][stage][expert-parallel rank] flattened
  std::vector<std::unique_ptr<TorchSaveFile>> legacy_;
  int legacy_tp_ = 0, legacy_pp_ = 1, legacy_ep_ = 1;
  std::map<std::string, DistTensor> stored_;  // torch_dist, by stored name
  std::map<std::string, Source> sources_;   // by Megatron-Core name
  std::vector<std::string> names_;
  int64_t num_layers_ = 0;
};

// Megatron-Core's name for the tensor our model calls `name` in `checkpoint`: the same, or the
// local layer spec's (input_layernorm.weight for the TE spec's linear_qkv.layer_norm_weight,
// pre_mlp_layernorm.weight for linear_fc1.layer_norm_weight, MLA's q_layernorm / kv_layernorm for
// linear_q_up_proj / linear_kv_up_proj.layer_norm_weight, and the reverse for an MoE layer's
// pre_mlp_layernorm, which the local spec's torch_dist keys file under mlp.linear_fc1). Empty
// when it has none of them.
std::string megatron_source_name(const MegatronCheckpoint& checkpoint, const std::string& name);

}  // namespace megatron
