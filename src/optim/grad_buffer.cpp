#include "optim/grad_buffer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "core/streams.h"
#include "kernels/ops.h"
#include "tensor_parallel/grad_accumulation.h"

namespace megatron {

struct GradReadyHook : torch::autograd::PostAccumulateGradHook {
  GradReadyHook(ParamAndGradBuffer* owner, size_t index) : owner(owner), index(index) {}
  void operator()(const torch::autograd::Variable&) override { owner->on_grad_ready(index); }
  ParamAndGradBuffer* owner;
  size_t index;
};

ParamAndGradBuffer::ParamAndGradBuffer(const std::vector<NamedTensor>& named, const dist::ParallelState& ps,
                                       const GradBufferOptions& options)
    : ps_(ps), options_(options), reduce_group_(options.grad_group == tp::GradGroup::DataParallel ? ps.dp_cp : ps.expert_dp) {
  TORCH_CHECK(!named.empty(), "ParamAndGradBuffer: no parameters");
  const int dp = reduce_group_.size();
  const at::TensorOptions param_options = named[0].tensor.options();
  // Buckets padded to a multiple of DP (times 64 elements, to keep shards aligned).
  const int64_t pad = options.distributed_optimizer ? int64_t(dp) * 64 : 1;
  auto round_up = [&](int64_t n) { return (n + pad - 1) / pad * pad; };

  int64_t offset = 0;
  Bucket bucket;
  int chunks = 1;
  auto close_bucket = [&] {
    if (bucket.params.empty()) return;
    offset = bucket.begin + round_up(offset - bucket.begin);
    bucket.end = offset;
    buckets_.push_back(std::move(bucket));
    bucket = Bucket();
    bucket.begin = offset;
  };
  for (auto it = named.rbegin(); it != named.rend(); ++it) {
    TORCH_CHECK(it->tensor.scalar_type() == param_options.dtype().toScalarType(), "parameters of mixed dtypes");
    TORCH_CHECK(it->info.grad_group == options.grad_group, "ParamAndGradBuffer: '", it->name,
                "' reduces over another group than this buffer's; it belongs in a buffer of that group");
    const bool tied = options.tied_embedding_across_stages && it->info.word_embedding;
    if (tied) close_bucket();  // alone in its bucket
    BufferedParam p;
    p.name = it->name;
    p.param = it->tensor;
    p.offset = offset;
    p.numel = it->tensor.numel();
    p.bucket = buckets_.size();
    p.chunk = it->chunk;
    chunks = std::max(chunks, it->chunk + 1);
    p.tp_duplicate = it->info.split.replicated();
    p.tp_partial_grad = ps.tp.size() > 1 && it->info.partial_grad;
    p.tied_embedding = tied;
    p.stage_copy = tied && ps.pp.rank() != 0;
    offset += p.numel;
    bucket.params.push_back(params_.size());
    params_.push_back(std::move(p));
    if (tied || offset - bucket.begin >= options.bucket_size) close_bucket();
  }
  close_bucket();
  last_micro_batch_.assign(size_t(chunks), true);

  at::NoGradGuard no_grad;
  param_data = at::zeros({offset}, param_options);
  grad_data = at::zeros({offset}, param_options.dtype(options.grad_reduce_in_bf16 ? at::kBFloat16 : at::kFloat));
  for (size_t i = 0; i < params_.size(); ++i) {
    BufferedParam& p = params_[i];
    at::Tensor view = param_data.narrow(0, p.offset, p.numel).view(p.param.sizes());
    view.copy_(p.param);
    p.param.set_data(view);  // the parameter now lives in the buffer
    p.main_grad = grad_data.narrow(0, p.offset, p.numel).view(p.param.sizes());
    torch::autograd::impl::set_post_acc_grad_hooks(p.param, std::make_unique<GradReadyHook>(this, i));
    if (options.gradient_accumulation_fusion) {
      tp::register_main_grad(p.param, {p.main_grad, [this, i] { return take_first_add(i); }, [this, i] { grad_added(i); }});
    }
    bucket_of_[p.param.unsafeGetTensorImpl()] = p.bucket;
  }
}

ParamAndGradBuffer::~ParamAndGradBuffer() {
  for (auto& p : params_) {
    torch::autograd::impl::set_post_acc_grad_hooks(p.param, nullptr);
    if (options_.gradient_accumulation_fusion) tp::unregister_main_grad(p.param);
  }
}

void ParamAndGradBuffer::zero_grad() {
  // No pass over the 4-bytes-per-parameter buffer: each parameter's first gradient of the step
  // overwrites its main_grad, and finish_grad_sync() zeroes those that received none. Padding
  // between parameters is never written and stays zero from allocation.
  for (auto& p : params_) p.has_grad = false;
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
  }
}

void ParamAndGradBuffer::on_grad_ready(size_t index) {
  BufferedParam& p = params_[index];
  at::Tensor& grad = p.param.mutable_grad();
  // Gradient-accumulation fusion already added this micro-batch's gradient (and called
  // grad_added); autograd still runs the hook, with no .grad.
  if (!grad.defined()) return;
  // Upcasts bf16 gradients into the fp32 accumulator; the step's first gradient overwrites.
  kernels::accumulate_grad(p.main_grad, grad, take_first_add(index));
  grad = at::Tensor();
  grad_added(index);
}

bool ParamAndGradBuffer::take_first_add(size_t index) {
  BufferedParam& p = params_[index];
  const bool first = !p.has_grad;
  p.has_grad = true;
  // The first write into main_grad this step: the previous optimizer step must have read it.
  // The forward has normally waited already (every parameter is used before its gradient).
  if (first) wait_for_update(buckets_[p.bucket]);
  return first;
}

void ParamAndGradBuffer::grad_added(size_t index) {
  const BufferedParam& p = params_[index];
  if (!last_micro_batch_[size_t(p.chunk)] || !options_.overlap_grad_reduce) return;
  Bucket& b = buckets_[p.bucket];
  if (b.pending > 0 && --b.pending == 0) launch(b);
}

std::pair<int64_t, int64_t> ParamAndGradBuffer::shard_of(const Bucket& b) const {
  const int64_t size = (b.end - b.begin) / reduce_group_.size();
  const int64_t begin = b.begin + size * reduce_group_.rank();
  return {begin, begin + size};
}

void ParamAndGradBuffer::launch(Bucket& b) {
  if (b.launched) return;
  b.launched = true;
  at::NoGradGuard no_grad;
  at::Tensor grads = grad_data.narrow(0, b.begin, b.end - b.begin);
  // An expert's gradient sums the tokens that reached it: those of every expert-parallel rank and
  // expert-TP rank. Megatron scales expert gradients as dense ones, by 1 / (dense DP size), and
  // sums them over expert DP; since etp x ep x expert-dp = tp x dp x cp (one stage's ranks) that
  // is the mean over expert DP times tp / (ep x etp): 1/ep with expert TP = TP, and e.g. 2 under
  // TP=2 with expert TP 1 and no EP (each TP rank's experts saw half of the sequence).
  const double expert_scale = options_.grad_group == tp::GradGroup::ExpertDataParallel
                                  ? double(ps_.tp.size()) / double(ps_.ep.size() * ps_.expert_tp.size())
                                  : 1.0;
  if (reduce_group_.size() == 1) {
    if (expert_scale != 1.0) grads.mul_(expert_scale);
    return;
  }
  // Averaged over replicas: by the collective where it can (NCCL), else scaled first.
  dist::ReduceOp op = dist::ReduceOp::Avg;
  if (!reduce_group_.supports_avg()) {
    grads.mul_(expert_scale / reduce_group_.size());
    op = dist::ReduceOp::Sum;
  } else if (expert_scale != 1.0) {
    grads.mul_(expert_scale);
  }
  if (options_.distributed_optimizer) {
    const auto [begin, end] = shard_of(b);
    at::Tensor shard = grad_data.narrow(0, begin, end - begin);
    if (!reduce_group_.supports_in_place()) b.reduced = at::empty({end - begin}, grads.options());
    b.work = reduce_group_.reduce_scatter_async(b.reduced.defined() ? b.reduced : shard, grads, op);
  } else {
    b.work = reduce_group_.all_reduce_async(grads, op);
  }
}

void ParamAndGradBuffer::finish_grad_sync() {
  at::NoGradGuard no_grad;
  // A parameter no gradient reached this step (its bucket was not launched: pending > 0).
  for (auto& p : params_) {
    if (!p.has_grad) p.main_grad.zero_();
    p.has_grad = true;
  }
  for (auto& b : buckets_) launch(b);
  for (auto& b : buckets_) {
    b.work.wait();
    if (b.reduced.defined()) {
      const auto [begin, end] = shard_of(b);
      grad_data.narrow(0, begin, end - begin).copy_(b.reduced);
      b.reduced = at::Tensor();
    }
  }
  if (ps_.tp.size() > 1) {
    std::vector<at::Tensor> partial;
    for (auto& p : params_) {
      if (p.tp_partial_grad) partial.push_back(p.main_grad.view(-1));
    }
    if (!partial.empty()) {
      at::Tensor flat = at::cat(partial);
      ps_.tp.all_reduce(flat);
      int64_t at = 0;
      for (auto& g : partial) {
        g.copy_(flat.narrow(0, at, g.numel()));
        at += g.numel();
      }
    }
  }
  if (options_.tied_embedding_across_stages && ps_.embedding.size() > 1) {
    // After the DP reduction: with the distributed optimizer the weight's own bucket gives
    // both stages the same shard of it, so the reduced parts line up.
    for (auto& p : params_) {
      if (p.tied_embedding) ps_.embedding.all_reduce(p.main_grad);
    }
  }
}

void ParamAndGradBuffer::start_param_gather(size_t index) {
  if (!options_.distributed_optimizer || reduce_group_.size() == 1) return;
  Bucket& b = buckets_.at(index);
  const auto [begin, end] = shard_of(b);
  at::Tensor bucket = param_data.narrow(0, b.begin, b.end - b.begin);
  b.gathered_shard = param_data.narrow(0, begin, end - begin);
  if (!reduce_group_.supports_in_place()) b.gathered_shard = b.gathered_shard.clone();
  b.gather = reduce_group_.all_gather_async(bucket, b.gathered_shard);
}

void ParamAndGradBuffer::set_params_updated(size_t bucket, c10::Event updated) {
  buckets_.at(bucket).updated.emplace(std::move(updated));
}

void ParamAndGradBuffer::wait_for_update(Bucket& b) {
  if (!b.updated) return;
  b.updated->block(current_stream(param_data.device()));
  b.updated.reset();  // later work on this stream is ordered after it anyway
}

void ParamAndGradBuffer::wait_for_bucket(Bucket& b) {
  wait_for_update(b);
  b.gather.wait();  // started on the optimizer's stream after the update, so it follows it
  b.gathered_shard = at::Tensor();
}

void ParamAndGradBuffer::finish_param_gather() {
  for (auto& b : buckets_) wait_for_bucket(b);
}

void ParamAndGradBuffer::wait_for_params(const std::vector<at::Tensor>& params) {
  for (const auto& p : params) {
    auto it = bucket_of_.find(p.unsafeGetTensorImpl());
    if (it != bucket_of_.end()) wait_for_bucket(buckets_[it->second]);
  }
}

std::vector<std::pair<int64_t, int64_t>> ParamAndGradBuffer::owned_ranges() const {
  if (!options_.distributed_optimizer) return {{0, param_data.numel()}};
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const auto& b : buckets_) ranges.push_back(shard_of(b));
  return ranges;
}

}  // namespace megatron
