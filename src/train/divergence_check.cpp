#include "train/divergence_check.h"

#include <ATen/ATen.h>

#include <cmath>

#include "core/streams.h"

namespace megatron {

DivergenceCheck::DivergenceCheck(bool enabled, const c10::Device& device) : enabled_(enabled), device_(device) {}

void DivergenceCheck::add(int64_t iteration, const at::Tensor& loss, const at::Tensor& grad_norm) {
  if (!enabled_) return;
  const at::Tensor values = at::stack({loss.reshape({}).to(at::kDouble), grad_norm.reshape({}).to(at::kDouble)});
  Pending p;
  p.iteration = iteration;
  if (device_.is_cpu()) {
    p.host = values;
  } else {
    p.host = at::empty({2}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true));
    p.host.copy_(values, /*non_blocking=*/true);
    p.ready.emplace(device_.type());
    p.ready->record(current_stream(device_));
  }
  pending_.push_back(std::move(p));
}

std::optional<std::string> DivergenceCheck::check(size_t keep) {
  while (pending_.size() > keep) {
    Pending due = std::move(pending_.front());
    pending_.pop_front();
    if (due.ready) due.ready->synchronize();
    const double loss = due.host.data_ptr<double>()[0], grad_norm = due.host.data_ptr<double>()[1];
    if (std::isfinite(loss) && std::isfinite(grad_norm)) continue;
    pending_.clear();
    auto text = [](double v) {  // "nan", not glibc's "-nan" for a NaN with its sign bit set
      if (std::isnan(v)) return std::string("nan");
      char out[32];
      std::snprintf(out, sizeof(out), "%g", v);
      return std::string(out);
    };
    const std::string values = "lm loss " + text(loss) + ", grad norm " + text(grad_norm);
    return "iteration " + std::to_string(due.iteration) + ": " + (std::isfinite(loss) ? "the gradient norm" : "the loss") +
           " is not finite (" + values + "): the run diverged. Stopped by --check-for-nan-in-loss-and-grad (on by default, "
           "as in Megatron) before saving anything after it; resume from the last checkpoint with a lower --lr, a longer "
           "--lr-warmup-iters or a smaller --clip-grad, or give --no-check-for-nan-in-loss-and-grad to skip such steps and "
           "count them instead";
  }
  return std::nullopt;
}

}  // namespace megatron
