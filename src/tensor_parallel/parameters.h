// What a parameter is, declared by the part that creates it, as Megatron-Core's
// set_tensor_model_parallel_attributes does: how it splits over tensor-parallel ranks, whether
// each rank's gradient is only a partial sum, whether it belongs to an expert, how it is
// initialised and over which group its gradient is reduced. Sharding, initialisation, the
// gradient buffers, the checkpoint tensor table, resharding and the HF mapping read this
// description; none of them reads meaning into a parameter's name.
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <string>
#include <vector>

namespace megatron::tp {

// How a tensor splits over TP ranks: column-parallel weights split their output rows (dim 0),
// row-parallel weights their input columns (dim 1). A gated tensor (SwiGLU's fc1) holds two
// stacked halves along dim 0, each split on its own: a rank holds [gate block; up block].
struct ShardSpec {
  int dim = -1;        // split dimension; -1 = replicated on every TP rank
  bool gated = false;
  bool replicated() const { return dim < 0; }
};

// Megatron's initialisation rules.
enum class Init {
  Normal,        // normal(0, init_method_std)
  ScaledNormal,  // normal(0, init_method_std / sqrt(2 * num_layers)): projections into the residual stream
  Ones,          // norm weights
  Zeros,         // biases, norm biases
};

// The ranks a gradient is averaged over after the backward.
enum class GradGroup {
  DataParallel,        // dense parameters: every replica of this model shard
  ExpertDataParallel,  // expert parameters: the replicas of this expert shard (expert parallelism)
};

struct ParamInfo {
  ShardSpec split;
  Init init = Init::Normal;
  bool vocab_rows = false;      // dim 0 is the padded vocabulary: resharding pads or trims it
  bool word_embedding = false;  // the input embedding, which a tied output layer shares
  // Each TP rank holds only a partial sum of the gradient of this replicated parameter, to be
  // all-reduced over TP: norms applied to sequence shards and biases added after a
  // reduce-scatter (sequence parallelism), q/k norms applied to each rank's own heads.
  bool partial_grad = false;
  int expert = -1;              // the global index of the expert it belongs to; -1: dense
  GradGroup grad_group = GradGroup::DataParallel;
  // false: state the model carries (checkpoints, HF) that no gradient or optimizer touches; the
  // model updates it itself (a router's expert bias). Registered without requires_grad.
  bool trainable = true;
  // Stays fp32 when the model is cast to bf16 (an expert bias moves in steps of 1e-3).
  bool keep_fp32 = false;
};

// Every parameter of a model (chunk) by its global name, in registration order.
class ParamTable {
 public:
  void add(const std::string& name, const ParamInfo& info);  // a second add of a name keeps the first
  bool contains(const std::string& name) const { return info_.count(name) > 0; }
  const ParamInfo& at(const std::string& name) const;        // TORCH_CHECK: described
  const std::vector<std::string>& names() const { return names_; }
  void merge(const ParamTable& other);

 private:
  std::vector<std::string> names_;
  std::map<std::string, ParamInfo> info_;
};

// A module whose parameters carry their description. Every module of the model that registers
// parameters derives from it.
class DescribedModule : public torch::nn::Module {
 public:
  // Registers `tensor` as parameter `name` of this module, described by `info`.
  at::Tensor add_parameter(const std::string& name, const at::Tensor& tensor, const ParamInfo& info);
  const std::map<std::string, ParamInfo>& own_parameter_info() const { return info_; }

 private:
  std::map<std::string, ParamInfo> info_;
};

// The description of every parameter under `root`, by the name named_parameters() gives it.
// TORCH_CHECK: every parameter was registered through DescribedModule::add_parameter.
ParamTable describe_parameters(const torch::nn::Module& root);

}  // namespace megatron::tp
