#include "fp8/recipe.h"

#include <ATen/ATen.h>

#include "fp8/quantize.h"

namespace megatron::fp8 {

Options options_for(const ModelConfig& c) {
  Options o;
  o.recipe = c.fp8_recipe == "tensorwise" ? Recipe::Tensorwise : c.fp8_recipe == "blockwise" ? Recipe::Blockwise : Recipe::Delayed;
  o.backward_type = c.fp8 == "hybrid" ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn;
  o.margin = c.fp8_margin;
  o.history_len = c.fp8_amax_history_len;
  o.history_max = c.fp8_amax_compute_algo == "max";
  o.wgrad = c.fp8_wgrad;
  return o;
}

DelayedScaling::DelayedScaling(int64_t history_len, bool history_max, int margin)
    : history_len_(history_len), history_max_(history_max), margin_(margin) {}

int DelayedScaling::add(double fp8_max) {
  TORCH_CHECK(!history_.defined(), "DelayedScaling: tensors are added before the first use");
  fp8_max_.push_back(fp8_max);
  return int(fp8_max_.size()) - 1;
}

void DelayedScaling::ensure(const at::Device& device) {
  if (history_.defined()) {
    if (history_.device() != device) {
      history_ = history_.to(device);
      scale_ = scale_.to(device);
      limits_ = limits_.to(device);
    }
    return;
  }
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const int64_t n = int64_t(fp8_max_.size());
  history_ = at::zeros({history_len_, n}, f32);
  scale_ = at::ones({n}, f32);  // Transformer Engine starts every scale at 1
  limits_ = at::tensor(fp8_max_, at::TensorOptions().dtype(at::kDouble)).to(f32);
}

at::Tensor DelayedScaling::scale(int i, const at::Device& device) {
  ensure(device);
  return scale_.select(0, i);
}

void DelayedScaling::update(const std::function<void(at::Tensor&)>& reduce_max) {
  if (!history_.defined()) return;  // nothing cast yet
  at::Tensor current = history_.select(0, 0);  // [n]
  reduce_max(current);
  const at::Tensor amax = history_max_ ? std::get<0>(history_.max(0)) : current.clone();  // [n]
  scale_.copy_(scale_from_amax(amax, limits_, margin_, /*fallback=*/scale_));
  // Transformer Engine's roll: the oldest row drops out, the current row starts again at zero.
  if (history_len_ > 1) history_.copy_(history_.roll(-1, 0));
  history_.select(0, 0).zero_();
}

std::pair<at::Tensor, at::Tensor> DelayedScaling::column(int i) const {
  if (!history_.defined()) return {};
  return {history_.select(1, i), scale_.select(0, i)};
}

void DelayedScaling::set_column(int i, const at::Tensor& history, const at::Tensor& scale, const at::Device& device) {
  ensure(device);
  at::Tensor mine = history_.select(1, i);  // [L]
  if (history.dim() == 1 && history.size(0) == history_len_) {
    mine.copy_(history);
  } else {
    mine.zero_();
  }
  scale_.select(0, i).copy_(scale.reshape({}));
}

Fp8Context::Fp8Context(const Options& options)
    : options_(options), delayed_(options.history_len, options.history_max, options.margin) {}

}  // namespace megatron::fp8
