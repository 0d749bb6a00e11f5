#include "train/model_terms.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "model/gpt_model.h"
#include "model/mtp.h"
#include "moe/aux_loss.h"

namespace megatron {

ModelTerms::ModelTerms(const ModelConfig& m) {
  names_ = mtp_loss_names(m);
  mtp_ = int64_t(names_.size());
  for (const auto& name : moe::tracked_loss_names(m)) names_.push_back(name);
  moe_ = int64_t(names_.size()) - mtp_;
  // Each MTP depth is built as the decoder's last layer: an MoE layer when that one is.
  const int mtp_moe = m.is_moe_layer(m.num_layers - 1) ? m.mtp_num_layers : 0;
  moe_layers_ = std::max(m.num_moe_layers() + mtp_moe, 1);
}

void ModelTerms::collect(const std::vector<GPTModel*>& chunks, at::Tensor slots, const dist::Group& tp) const {
  if (mtp_ > 0) {
    at::Tensor mtp = slots.narrow(0, 0, mtp_);
    for (GPTModel* chunk : chunks) {
      const at::Tensor tracked = chunk->take_mtp_losses();
      if (tracked.defined()) mtp.add_(tracked.to(mtp.device()));
    }
  }
  if (moe_ > 0) {
    at::Tensor moe = slots.narrow(0, mtp_, moe_);
    for (GPTModel* chunk : chunks) {
      const at::Tensor tracked = chunk->take_moe_losses();
      if (tracked.defined()) moe.add_(tracked.to(moe.device()));
    }
    moe.div_(double(moe_layers_));
    if (tp.size() > 1) tp.all_reduce(moe);
  }
}

}  // namespace megatron
