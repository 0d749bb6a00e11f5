#include "optim/adamw.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>

#include "core/errors.h"
#include "core/streams.h"
#include "kernels/ops.h"

namespace megatron {

AdamW::AdamW(ParamAndGradBuffer& buffer, const TrainConfig& config)
    : buffer_(buffer),
      steps_(at::zeros({}, buffer.grad_data.options().dtype(at::kFloat))),
      lr_(at::zeros({}, buffer.grad_data.options().dtype(at::kDouble))),
      c_(config) {
  at::NoGradGuard no_grad;
  // Registration order (the buffer holds parameters reversed), so state files read naturally.
  std::vector<const BufferedParam*> ordered;
  for (const auto& p : buffer.params()) ordered.push_back(&p);
  std::reverse(ordered.begin(), ordered.end());
  for (const BufferedParam* p : ordered) {
    for (const auto& [begin, end] : buffer.owned_ranges()) {
      const int64_t from = std::max(begin, p->offset), to = std::min(end, p->offset + p->numel);
      if (from >= to) continue;
      OptimizerParam op;
      op.name = p->name;
      op.model_param = p->param;
      op.param_offset = from - p->offset;
      op.numel = to - from;
      op.model_slice = buffer.param_data.narrow(0, from, op.numel);
      op.master = op.model_slice.scalar_type() == at::kFloat ? op.model_slice : op.model_slice.to(at::kFloat).clone();
      op.main_grad = buffer.grad_data.narrow(0, from, op.numel);
      op.exp_avg = at::zeros_like(op.master);
      op.exp_avg_sq = at::zeros_like(op.master);
      op.decay = p->param.dim() > 1;  // norms and biases are 1-D
      op.tp_duplicate = p->tp_duplicate;
      op.stage_copy = p->stage_copy;
      op.bucket = p->bucket;
      params_.push_back(std::move(op));
    }
  }
  if (buffer.overlap_optimizer_step()) {
    TORCH_CHECK(buffer.param_data.is_cuda(), "AdamW: overlapping the optimizer step needs a CUDA buffer");
    update_stream_ = pooled_stream(buffer.param_data.device(), /*high_priority=*/false);
  }
}

at::Tensor AdamW::grad_norm() const {
  const dist::ParallelState& ps = buffer_.parallel_state();
  std::vector<at::Tensor> grads;
  for (const auto& p : params_) {
    if ((!p.tp_duplicate || ps.tp.rank() == 0) && !p.stage_copy) grads.push_back(p.main_grad);
  }
  // Norms in fp32 whatever the gradients' dtype (bf16 with --grad-reduce-in-bf16); fp32
  // gradients pass no dtype, the call measured on GPUs.
  const at::TensorOptions fp32 = buffer_.grad_data.options().dtype(at::kFloat);
  const std::optional<at::ScalarType> norm_dtype =
      buffer_.grad_data.scalar_type() == at::kFloat ? std::nullopt : std::optional<at::ScalarType>(at::kFloat);
  at::Tensor squared = grads.empty() ? at::zeros({}, fp32) : at::stack(at::_foreach_norm(grads, 2, norm_dtype)).pow(2).sum();
  // Replicas hold the same gradients, except that the distributed optimizer reduced each DP
  // rank's shard only.
  const dist::Group& group = buffer_.distributed_optimizer() ? ps.world : ps.model_parallel;
  if (group.size() > 1) {
    squared = squared.reshape({1}).contiguous();
    group.all_reduce(squared);
  }
  return squared.sqrt().reshape({});
}

void AdamW::set_learning_rate(double lr) { lr_.fill_(lr); }

at::Tensor AdamW::step(const at::Tensor& grad_norm, const at::Tensor& loss) {
  at::NoGradGuard no_grad;
  at::Tensor applied = grad_norm.isfinite();
  if (loss.defined()) applied = applied.logical_and(loss.isfinite().to(applied.device()));
  // Megatron's clip multiplies by clip / (norm + 1e-6) when that is below 1; the kernel divides
  // by its inverse. A skipped step never reads it (found_inf is checked first).
  const at::Tensor grad_scale = c_.clip_grad > 0.0 ? ((grad_norm + 1e-6) / c_.clip_grad).clamp_min(1.0)
                                                   : at::ones({}, grad_norm.options());
  steps_.add_(applied.to(at::kFloat));
  // Overlapped, the updates may still run when the next step's set_learning_rate writes lr_:
  // they read a copy of it.
  const at::Tensor lr = update_stream_ ? lr_.clone() : lr_;
  const kernels::AdamWStepScalars scalars =
      kernels::adamw_step_scalars(steps_, grad_scale, applied.logical_not(), lr, c_.adam_beta1, c_.adam_beta2);
  std::optional<c10::StreamGuard> on_update_stream;
  if (update_stream_) {
    // The update stream starts after everything the trainer's stream has queued (gradients,
    // norm, scalars), and the scalars' memory is not reused until it has read them.
    order_after(current_stream(buffer_.param_data.device()), *update_stream_);
    for (const at::Tensor* t : {&scalars.bias_corrections, &scalars.grad_scale, &scalars.found_inf, &scalars.lr}) {
      c10::impl::getDeviceGuardImpl(t->device().type())->recordDataPtrOnStream(t->storage().data_ptr(), *update_stream_);
    }
    on_update_stream.emplace(*update_stream_);
  }
  // Per parameter: masters, moments and the bf16 model weights in one fused kernel on CUDA;
  // elsewhere ATen's fused AdamW and a copy (kernels/ops.h). The parameters come in
  // registration order, so the buckets in descending order (the buffer is reversed): once a
  // bucket is stepped its all-gather (distributed optimizer) runs under the remaining updates,
  // and overlapped, the next forward's first layers can start on it. Buckets are started
  // strictly from the last down, also past those this rank holds none of, so every DP rank
  // issues the same sequence of collectives.
  size_t not_started = buffer_.num_buckets();
  for (size_t i = 0; i < params_.size(); ++i) {
    OptimizerParam& p = params_[i];
    const kernels::AdamWHyperparameters h{c_.adam_beta1, c_.adam_beta2, c_.adam_eps, p.decay ? c_.weight_decay : 0.0};
    kernels::adamw_step(p.master, p.exp_avg, p.exp_avg_sq, p.main_grad, p.model_slice, h, scalars);
    if (i + 1 == params_.size() || params_[i + 1].bucket != p.bucket) {
      if (update_stream_) {
        c10::Event updated(update_stream_->device_type());
        updated.record(*update_stream_);
        buffer_.set_params_updated(p.bucket, std::move(updated));
      }
      // On the update stream when overlapped: the collective then follows the update.
      while (not_started > p.bucket) buffer_.start_param_gather(--not_started);
    }
  }
  gather_params(not_started);
  return applied;
}

void AdamW::copy_master_to_model() {
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (!p.master.is_same(p.model_slice)) p.model_slice.copy_(p.master);
  }
  gather_params(buffer_.num_buckets());
}

void AdamW::gather_params(size_t not_started) {
  while (not_started > 0) buffer_.start_param_gather(--not_started);
  if (!buffer_.params_arrive_during_forward()) buffer_.finish_param_gather();
}

std::vector<NamedTensor> AdamW::state() const {
  std::vector<NamedTensor> out;
  for (const auto& p : params_) {
    auto shaped = [&](const at::Tensor& t) { return p.whole() ? t.view(p.model_param.sizes()) : t; };
    out.push_back({p.name + ".master", shaped(p.master)});
    out.push_back({p.name + ".exp_avg", shaped(p.exp_avg)});
    out.push_back({p.name + ".exp_avg_sq", shaped(p.exp_avg_sq)});
  }
  out.push_back({"step", steps_});  // [] fp32
  return out;
}

void AdamW::load_state(const std::vector<NamedTensor>& state, bool load_moments) {
  at::NoGradGuard no_grad;
  std::unordered_map<std::string, at::Tensor> by_name;
  for (const auto& t : state) by_name[t.name] = t.tensor;
  auto take = [&](const std::string& name, const OptimizerParam& p, at::Tensor& into) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw UserError("checkpoint has no optimizer tensor '" + name + "': load with --no-load-optim");
    const at::IntArrayRef expected = p.whole() ? p.model_param.sizes() : into.sizes();
    if (!it->second.sizes().equals(expected)) {
      throw UserError("checkpoint optimizer tensor '" + name + "' has shape " + c10::str(it->second.sizes()) +
                      ", this run expects " + c10::str(expected));
    }
    into.copy_(it->second.reshape({-1}));
  };
  for (auto& p : params_) {
    take(p.name + ".master", p, p.master);
    if (load_moments) {
      take(p.name + ".exp_avg", p, p.exp_avg);
      take(p.name + ".exp_avg_sq", p, p.exp_avg_sq);
    }
  }
  if (load_moments) {
    auto it = by_name.find("step");
    if (it == by_name.end()) throw UserError("checkpoint has no optimizer tensor 'step': load with --no-load-optim");
    steps_.copy_(it->second.reshape({}));
  }
  copy_master_to_model();
}

std::map<std::string, std::string> AdamW::state_offsets() const {
  std::map<std::string, std::string> offsets;
  for (const auto& p : params_) {
    if (!p.whole()) offsets["offset/" + p.name] = std::to_string(p.param_offset);
  }
  return offsets;
}

void AdamW::load_resharded(const std::function<at::Tensor(const std::string&, const std::string&, int64_t, int64_t)>& slice,
                           const at::Tensor& step) {
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    for (auto [field, into] : {std::pair<const char*, at::Tensor*>{"master", &p.master}, {"exp_avg", &p.exp_avg},
                               {"exp_avg_sq", &p.exp_avg_sq}}) {
      at::Tensor value = slice(p.name, field, p.param_offset, p.numel);
      if (value.numel() != p.numel) {
        throw UserError("checkpoint optimizer state '" + p.name + "." + field + "' gave " + std::to_string(value.numel()) +
                        " elements on this rank, expected " + std::to_string(p.numel));
      }
      into->copy_(value.reshape({-1}));
    }
  }
  steps_.copy_(step.reshape({}));
  copy_master_to_model();
}

void AdamW::reset_from_model() {
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (!p.master.is_same(p.model_slice)) p.master.copy_(p.model_slice);
  }
}

int64_t AdamW::steps_taken() const { return static_cast<int64_t>(steps_.item<float>()); }

}  // namespace megatron
