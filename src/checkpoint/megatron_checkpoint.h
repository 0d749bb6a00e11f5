// Checkpoints Megatron-LM saved, read without Python (`megatron convert --from megatron`):
//  - torch_dist (Megatron-Core dist checkpointing): iter_XXXXXXX/.metadata (PyTorch distributed
//    checkpointing's pickled Metadata: each tensor's global shape and the chunks it was saved
//    in), the __R_I.distcp files (each chunk a torch.save'd tensor at a byte range) and common.pt
//    (the run's arguments). Tensors are global, whatever layout saved them; a layer's tensors
//    are stacked over layers ("decoder.layers.self_attention.linear_qkv.weight" [L, ...]) or
//    saved per layer ("decoder.layers.3.self_attention...").
//  - legacy: iter_XXXXXXX/mp_rank_XX/model_optim_rng.pt, a torch.save'd dict with "args" and the
//    "model" state dict, one file per tensor-parallel rank (pipeline stages are not read yet).
// Names come out as Megatron-Core's, one tensor per layer ("decoder.layers.3.<...>").
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/torch_save.h"
#include "core/config.h"

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
  int parts() const { return format_ == Format::Legacy ? static_cast<int>(legacy_.size()) : 1; }
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
  struct Source {              // where a (layer's) tensor lives
    std::string key;           // torch_dist: the stored name; legacy: the state dict key
    int64_t layer = -1;        // torch_dist stacked layers: the index along the first dimension
  };
  void open_torch_dist();
  void open_legacy();
  // The stored tensor, whole, or (layer >= 0) its slice `layer` of a stack over layers: only the
  // chunks that hold it are read, so a stacked tensor is not read once per layer.
  at::Tensor read_dist(const DistTensor& t, int64_t layer) const;

  std::string dir_;
  Format format_ = Format::TorchDist;
  int64_t iteration_ = 0;
  std::unique_ptr<TorchSaveFile> common_;  // common.pt (torch_dist), or rank 0's model_optim_rng.pt (legacy)
  std::vector<std::unique_ptr<TorchSaveFile>> legacy_;  // legacy: every tensor-parallel rank's file
  std::map<std::string, DistTensor> stored_;  // torch_dist, by stored name
  std::map<std::string, Source> sources_;   // by Megatron-Core name
  std::vector<std::string> names_;
  int64_t num_layers_ = 0;
};

// The ModelConfig of a Megatron run's arguments (dense GPT models: Llama, Qwen, Mistral, GPT);
// UserError naming the argument for what it cannot build yet (MoE, MLA, ...).
ModelConfig model_config_from_megatron_args(const pickle::Value& args, const std::string& what);

// Megatron-Core's name for the tensor our model calls `name` in `checkpoint`: the same, or the
// local layer spec's (input_layernorm.weight for the TE spec's linear_qkv.layer_norm_weight,
// pre_mlp_layernorm.weight for linear_fc1.layer_norm_weight). Empty when it has neither.
std::string megatron_source_name(const MegatronCheckpoint& checkpoint, const std::string& name);

}  // namespace megatron
