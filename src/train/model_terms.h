// The loss terms the model tracks itself, reported after its family's (train/trainer): the
// multi-token prediction depths' mean losses ("mtp_1 loss", ...; averaged as the loss is) and
// the MoE routers' losses (moe/aux_loss.h; as Megatron reports them: averaged over the MoE
// layers, each layer's summed over TP). Both then go through the step's loss reduction (summed
// over the pipeline stages, averaged over DP).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "core/config.h"
#include "distributed/process_group.h"

namespace megatron {

class GPTModel;

class ModelTerms {
 public:
  ModelTerms() = default;
  explicit ModelTerms(const ModelConfig& model);
  const std::vector<std::string>& names() const { return names_; }  // the MTP depths', then the routers'
  int64_t size() const { return int64_t(names_.size()); }
  // After a training step's forward and backward: what `chunks` tracked, into `slots` [size()].
  void collect(const std::vector<GPTModel*>& chunks, at::Tensor slots, const dist::Group& tp) const;

 private:
  int64_t mtp_ = 0, moe_ = 0;  // how many of each
  int moe_layers_ = 1;         // the MoE layers of the decoder and of the MTP depths
  std::vector<std::string> names_;
};

}  // namespace megatron
