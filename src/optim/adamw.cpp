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
#include "model/parameter_names.h"
#include "optim/host_optimizer.h"

namespace megatron {
namespace {

// --exp-avg-dtype / --exp-avg-sq-dtype (finalize_config admits fp32 and bf16; fp32 unless the
// precision-aware optimizer is on).
at::ScalarType moment_dtype(const std::string& name) { return name == "bf16" ? at::kBFloat16 : at::kFloat; }

}  // namespace

bool stores_param_remainders(const TrainConfig& config) {
  return config.use_precision_aware_optimizer && config.main_params_dtype == "fp32";
}

at::Tensor OptimizerParam::master_fp32() const {
  return master_is_remainder() ? kernels::join_master(host_weights.defined() ? host_weights : model_slice, master) : master;
}

namespace {

// Where a loaded fp32 master goes: `master` itself, or a staging tensor that store_master then
// splits into the bf16 weight and its remainder.
at::Tensor master_destination(const OptimizerParam& p) {
  return p.master_is_remainder() ? at::empty({p.numel}, p.master.options().dtype(at::kFloat)) : p.master;
}
void store_master(OptimizerParam& p, const at::Tensor& loaded) {
  if (!p.master_is_remainder()) return;
  if (!p.host_weights.defined()) {
    kernels::split_master(loaded, p.model_slice, p.master);
    return;
  }
  kernels::split_master(loaded, p.host_weights, p.master);  // offloaded: on the host, then the weights across
  p.model_slice.copy_(p.host_weights);
}

}  // namespace

AdamW::AdamW(ParamAndGradBuffer& buffer, const TrainConfig& config) : AdamW(std::vector<ParamAndGradBuffer*>{&buffer}, config) {}

AdamW::~AdamW() = default;

AdamW::AdamW(const std::vector<ParamAndGradBuffer*>& buffers, const TrainConfig& config, int64_t host_chunk_elements)
    : buffers_(buffers),
      steps_(at::zeros({}, buffers.at(0)->grad_data.options().dtype(at::kFloat))),
      lr_(at::zeros({}, buffers.at(0)->grad_data.options().dtype(at::kDouble))),
      decoupled_lr_(at::zeros({}, buffers.at(0)->grad_data.options().dtype(at::kDouble))),
      c_(config) {
  at::NoGradGuard no_grad;
  for (size_t b = 0; b < buffers_.size(); ++b) {
    ParamAndGradBuffer& buffer = *buffers_[b];
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
        if (op.model_slice.scalar_type() == at::kFloat) {
          op.master = op.model_slice;
        } else if (stores_param_remainders(config) && op.model_slice.scalar_type() == at::kBFloat16) {
          op.master = at::zeros({op.numel}, op.model_slice.options().dtype(at::kShort));  // the bf16 weight is the master
        } else {
          op.master = op.model_slice.to(at::kFloat).clone();
        }
        op.main_grad = buffer.grad_data.narrow(0, from, op.numel);
        op.exp_avg = at::zeros({op.numel}, op.model_slice.options().dtype(moment_dtype(config.exp_avg_dtype)));
        op.exp_avg_sq = at::zeros({op.numel}, op.model_slice.options().dtype(moment_dtype(config.exp_avg_sq_dtype)));
        op.decay = p->param.dim() > 1;  // norms and biases are 1-D
        op.decoupled_lr = config.decoupled_lr >= 0.0 && is_embedding_or_output(p->name);
        op.tp_duplicate = p->tp_duplicate;
        op.stage_copy = p->stage_copy;
        op.buffer = b;
        op.bucket = p->bucket;
        params_.push_back(std::move(op));
      }
    }
    if (buffer.overlap_optimizer_step()) {
      TORCH_CHECK(buffer.param_data.is_cuda(), "AdamW: overlapping the optimizer step needs a CUDA buffer");
      if (!update_stream_) update_stream_ = pooled_stream(buffer.param_data.device(), /*high_priority=*/false);
    }
  }
  if (config.optimizer_cpu_offload) {
    host_ = std::make_unique<HostOptimizer>(params_, config, host_chunk_elements, first_buffer().parallel_state().world.rank() == 0);
  }
}

std::vector<size_t> AdamW::no_buckets_started() const {
  std::vector<size_t> n;
  for (const ParamAndGradBuffer* b : buffers_) n.push_back(b->num_buckets());
  return n;
}

at::Tensor AdamW::sum_over_model(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& per_buffer,
                                 const std::function<at::Tensor(const OptimizerParam&)>& field) const {
  const dist::ParallelState& ps = first_buffer().parallel_state();
  const at::TensorOptions fp32 = first_buffer().grad_data.options().dtype(at::kFloat);
  std::vector<at::Tensor> sums;  // per buffer
  for (size_t b = 0; b < buffers_.size(); ++b) {
    // Offloaded state sits in host memory: each device's tensors summed where they are.
    std::vector<at::Tensor> tensors, host_tensors;
    for (const auto& p : params_) {
      if (p.buffer == b && (!p.tp_duplicate || ps.tp.rank() == 0) && !p.stage_copy) {
        at::Tensor t = field(p);
        (t.device() == fp32.device() ? tensors : host_tensors).push_back(std::move(t));
      }
    }
    at::Tensor sum = tensors.empty() ? at::zeros({}, fp32) : per_buffer(tensors).to(at::kFloat);
    if (!host_tensors.empty()) sum = sum + per_buffer(host_tensors).to(fp32);
    sums.push_back(sum);
  }
  if (buffers_.size() == 1) {
    at::Tensor sum = sums[0];
    // Replicas hold the same values, except that the distributed optimizer holds each DP rank's
    // shard only.
    const dist::Group& group = first_buffer().distributed_optimizer() ? ps.world : ps.model_parallel;
    if (group.size() > 1) {
      sum = sum.reshape({1}).contiguous();
      group.all_reduce(sum);
    }
    return sum.reshape({});
  }
  // Several buffers reduce over different groups (expert parameters differ across EP ranks, which
  // replicate the dense ones): each buffer's sum over the world, divided by its replica count.
  at::Tensor sum = at::stack(sums);  // [buffers]
  for (size_t b = 0; b < buffers_.size(); ++b) {
    const ParamAndGradBuffer& buffer = *buffers_[b];
    if (!buffer.distributed_optimizer() && buffer.reduce_group().size() > 1) sum[int64_t(b)].div_(buffer.reduce_group().size());
  }
  sum = sum.contiguous();
  if (ps.world.size() > 1) ps.world.all_reduce(sum);
  return sum.sum().reshape({});
}

at::Tensor AdamW::grad_norm() const {
  // Norms in fp32 whatever the gradients' dtype (bf16 with --grad-reduce-in-bf16); fp32
  // gradients pass no dtype, the call measured on GPUs.
  const std::optional<at::ScalarType> norm_dtype =
      first_buffer().grad_data.scalar_type() == at::kFloat ? std::nullopt : std::optional<at::ScalarType>(at::kFloat);
  const at::Tensor squared = sum_over_model(
      [&](const std::vector<at::Tensor>& grads) { return at::stack(at::_foreach_norm(grads, 2, norm_dtype)).pow(2).sum(); },
      [](const OptimizerParam& p) { return p.main_grad; });
  return squared.sqrt();
}

at::Tensor AdamW::params_norm() const {
  const at::Tensor squared = sum_over_model(
      [](const std::vector<at::Tensor>& masters) { return at::stack(at::_foreach_norm(masters, 2)).pow(2).sum(); },
      [](const OptimizerParam& p) { return p.master_fp32(); });
  return squared.sqrt();
}

at::Tensor AdamW::grad_zeros() const {
  return sum_over_model(
      [](const std::vector<at::Tensor>& grads) {
        at::Tensor zeros = at::zeros({}, grads[0].options().dtype(at::kLong));
        for (const at::Tensor& g : grads) zeros += g.eq(0).sum();
        return zeros;
      },
      [](const OptimizerParam& p) { return p.main_grad; });
}

void AdamW::set_learning_rate(double lr, double decoupled_lr) {
  lr_.fill_(lr);
  if (c_.decoupled_lr >= 0.0) decoupled_lr_.fill_(decoupled_lr);
}

at::Tensor AdamW::step(const at::Tensor& grad_norm, const at::Tensor& loss, const at::Tensor& loss_scale) {
  at::NoGradGuard no_grad;
  at::Tensor applied = grad_norm.isfinite();
  if (loss.defined()) applied = applied.logical_and(loss.isfinite().to(applied.device()));
  // Megatron's clip multiplies by clip / (norm + 1e-6) when that is below 1; the kernel divides
  // by its inverse. A skipped step never reads it (found_inf is checked first).
  at::Tensor grad_scale = c_.clip_grad > 0.0 ? ((grad_norm + 1e-6) / c_.clip_grad).clamp_min(1.0)
                                             : at::ones({}, grad_norm.options());
  // Unscaling folded into the same division: one pass over the gradients, not two.
  if (loss_scale.defined()) grad_scale = grad_scale * loss_scale.to(grad_scale.scalar_type());
  steps_.add_(applied.to(at::kFloat));
  // Overlapped, the updates may still run when the next step's set_learning_rate writes lr_:
  // they read a copy of it.
  const at::Tensor lr = update_stream_ ? lr_.clone() : lr_;
  const kernels::AdamWStepScalars scalars =
      kernels::adamw_step_scalars(steps_, grad_scale, applied.logical_not(), lr, c_.adam_beta1, c_.adam_beta2);
  kernels::AdamWStepScalars decoupled = scalars;  // the embedding and output layer (--decoupled-lr)
  decoupled.lr = update_stream_ ? decoupled_lr_.clone() : decoupled_lr_;
  std::optional<c10::StreamGuard> on_update_stream;
  if (update_stream_) {
    // The update stream starts after everything the trainer's stream has queued (gradients,
    // norm, scalars), and the scalars' memory is not reused until it has read them.
    order_after(current_stream(first_buffer().param_data.device()), *update_stream_);
    for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&scalars.bias_corrections, &scalars.grad_scale,
                                                                         &scalars.found_inf, &scalars.lr, &decoupled.lr}) {
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
  // Offloaded parameters step on the host after the rest: their buckets' all-gathers wait for them.
  const bool offloaded = host_ && !host_->empty();
  std::vector<size_t> not_started = no_buckets_started();
  for (size_t i = 0; i < params_.size(); ++i) {
    OptimizerParam& p = params_[i];
    const kernels::AdamWHyperparameters h{c_.adam_beta1, c_.adam_beta2, c_.adam_eps, p.decay ? c_.weight_decay : 0.0};
    if (!p.on_host) kernels::adamw_step(p.master, p.exp_avg, p.exp_avg_sq, p.main_grad, p.model_slice, h, p.decoupled_lr ? decoupled : scalars);
    if (offloaded) continue;
    if (i + 1 == params_.size() || params_[i + 1].bucket != p.bucket || params_[i + 1].buffer != p.buffer) {
      ParamAndGradBuffer& buffer = *buffers_[p.buffer];
      if (update_stream_) {
        c10::Event updated(update_stream_->device_type());
        updated.record(*update_stream_);
        buffer.set_params_updated(p.bucket, std::move(updated));
      }
      // On the update stream when overlapped: the collective then follows the update.
      while (not_started[p.buffer] > p.bucket) buffer.start_param_gather(--not_started[p.buffer]);
    }
  }
  if (offloaded) host_->step(params_, scalars, decoupled, c_);
  gather_params(not_started);
  return applied;
}

void AdamW::copy_master_to_model() {
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (!p.master.is_same(p.model_slice) && !p.master_is_remainder()) p.model_slice.copy_(p.master);
  }
  gather_params(no_buckets_started());
}

void AdamW::gather_params(std::vector<size_t> not_started) {
  for (size_t b = 0; b < buffers_.size(); ++b) {
    while (not_started[b] > 0) buffers_[b]->start_param_gather(--not_started[b]);
    if (!buffers_[b]->params_arrive_during_forward()) buffers_[b]->finish_param_gather();
  }
}

std::vector<NamedTensor> AdamW::state() const {
  std::vector<NamedTensor> out;
  for (const auto& p : params_) {
    auto shaped = [&](const at::Tensor& t) { return p.whole() ? t.view(p.model_param.sizes()) : t; };
    out.push_back({p.name + ".master", shaped(p.master_fp32())});  // fp32 whatever is kept
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
    at::Tensor master = master_destination(p);
    take(p.name + ".master", p, master);
    store_master(p, master);
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
    at::Tensor master = master_destination(p);
    for (auto [field, into] : {std::pair<const char*, at::Tensor*>{"master", &master}, {"exp_avg", &p.exp_avg},
                               {"exp_avg_sq", &p.exp_avg_sq}}) {
      at::Tensor value = slice(p.name, field, p.param_offset, p.numel);
      if (value.numel() != p.numel) {
        throw UserError("checkpoint optimizer state '" + p.name + "." + field + "' gave " + std::to_string(value.numel()) +
                        " elements on this rank, expected " + std::to_string(p.numel));
      }
      into->copy_(value.reshape({-1}));
    }
    store_master(p, master);
  }
  steps_.copy_(step.reshape({}));
  copy_master_to_model();
}

void AdamW::reset_from_model() {
  at::NoGradGuard no_grad;
  for (auto& p : params_) {
    if (p.master_is_remainder()) {
      p.master.zero_();  // the bf16 weight is the whole master
      if (p.host_weights.defined()) p.host_weights.copy_(p.model_slice);
    } else if (!p.master.is_same(p.model_slice)) {
      p.master.copy_(p.model_slice);
    }
  }
}

int64_t AdamW::steps_taken() const { return static_cast<int64_t>(steps_.item<float>()); }

}  // namespace megatron
