// One training step of the Trainer (train/trainer_impl.h): forward and backward over the global
// batch under the pipeline schedule, the gradients' sync, the optimizer step (eagerly or as a CUDA
// graph), the loss averaged over the stages and replicas, and evaluation on the same machinery.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>

#include "context_parallel/chunks.h"
#include "core/errors.h"
#include "core/memory.h"
#include "pipeline/schedules.h"
#include "train/batch_transfer.h"
#include "train/precision.h"
#include "train/trainer_impl.h"

namespace megatron {

StepOutcome Trainer::train_step(int64_t micro_batches, const BatchFn& batch) {
  // Gradients land in the buffer's main_grad through its hooks.
  const at::Tensor sums = forward_backward(micro_batches, batch, /*forward_only=*/false);
  for (ParamAndGradBuffer* b : buffers()) b->finish_grad_sync();
  // As Megatron's finalize_model_grads: the expert biases move once per step, from its counts.
  for (auto& chunk : chunks_) chunk->update_expert_biases();
  // --fp8-format: the delayed recipe's scales move, and the next forward casts the updated weights.
  for (auto& chunk : chunks_) chunk->finish_fp8_step();
  StepOutcome r;
  const at::Tensor global = global_loss(sums);  // [1 + terms + 1]: the last, the loss tokens (per DP rank)
  const at::Tensor tokens = global[global.size(0) - 1].clamp_min(1.0);
  if (t_.calculate_per_token_loss) {
    // Megatron's finalize_model_grads: the gradients summed over every loss token of the global
    // batch, divided by their count. The buffers averaged over DP, and `tokens` is that average.
    const at::Tensor scale = 1.0 / tokens;
    for (ParamAndGradBuffer* b : buffers()) b->grad_data.mul_(scale);
  }
  // Reported as Megatron's train_step does in either mode: every loss token of the global batch
  // alike (sum / count), whatever the micro-batches' shares.
  r.loss = global[0] / tokens;
  // Under --fp16 the gradients are the loss scale's multiple until the optimizer divides them.
  r.grad_norm = scaler_ ? optimizer_->grad_norm() / scaler_->scale() : optimizer_->grad_norm();
  if (t_.log_num_zeros_in_grad) r.grad_zeros = optimizer_->grad_zeros();
  r.terms = global.narrow(0, 1, int64_t(loss_terms_.size()) + model_terms_.size());
  // Here, not after the step: collectives run in order on one NCCL stream, and the optimizer
  // step queues the parameter all-gathers (distributed optimizer). Queued behind them, the poll's
  // copy to the host would hold the next forward until every bucket had arrived (5 ms exposed
  // per step at DP=2 on the reference shape) instead of layer by layer.
  stop_->launch_poll();
  r.applied = optimizer_->step(r.grad_norm, r.loss, scaler_ ? scaler_->scale() : at::Tensor());
  if (scaler_) {
    scaler_->update(r.grad_norm.isfinite().logical_not());  // Megatron's found_inf: the gradients only
    r.loss_scale = scaler_->scale().clone();
  }
  if (t_.log_params_norm) r.params_norm = optimizer_->params_norm();  // after the update, as Megatron
  return r;
}

StepOutcome Trainer::graphed_step(int64_t micro_batches, const BatchFn& batch) {
  if (graph_warmup_left_ > 0) {
    --graph_warmup_left_;
    return train_step(micro_batches, batch);
  }
  graph_inputs_.resize(size_t(micro_batches));
  for (int64_t k = 0; k < micro_batches; ++k) copy_batch(batch(k), graph_inputs_[size_t(k)], device_);
  if (!step_graph_->captured()) {
    // The eager steps' overlapped updates are joined first: a graph cannot wait for work
    // queued outside it.
    for (ParamAndGradBuffer* b : buffers()) b->finish_param_gather();
    const auto start = std::chrono::steady_clock::now();
    const size_t nodes = step_graph_->capture([&] {
      graph_result_ = train_step(micro_batches, [this](int64_t k) { return graph_inputs_[size_t(k)]; });
      // A graph must end on its own stream: the overlapped optimizer step joins it here.
      for (ParamAndGradBuffer* b : buffers()) b->finish_param_gather();
    });
    if (prints_setup()) {
      std::printf("> CUDA graph: captured the training step at iteration %lld (%zu nodes, %.2f s); replayed from now on\n",
                  static_cast<long long>(progress_.iteration), nodes,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      std::fflush(stdout);
    }
  }
  step_graph_->replay();
  // The replay cast the weights of its step again on the device; the host's step count, which
  // eager forwards (validation) key their FP8 weight casts on, moves with it.
  for (auto& chunk : chunks_) {
    if (chunk->fp8_context()) chunk->fp8_context()->next_step();
  }
  return graph_result_;
}

at::Tensor Trainer::global_loss(const at::Tensor& sums) {
  at::Tensor v = sums.to(at::kDouble).reshape({-1}).contiguous();
  // Summed over the stages: only the last has the loss and the family's terms (the others hold
  // zeros there, so the sum is exact), while MoE router losses come from every stage's layers.
  // Then averaged over DP (and CP: each CP rank has its chunks' losses and tokens), on every stage.
  if (ps_.pp.size() > 1) ps_.pp.all_reduce(v);
  if (ps_.dp_cp.size() > 1) {
    ps_.dp_cp.all_reduce(v);
    v.div_(ps_.dp_cp.size());
  }
  return v.reshape(sums.sizes());
}

Batch Trainer::rank_batch(const SampleSource& source, int64_t first) const {
  Batch b = make_batch(source, first, t_.micro_batch_size, c_.model.seq_length, c_.model.vocab_size, ltor_);
  if (ps_.cp.size() == 1) return b;
  Batch mine = cp::rank_batch(b, ps_.cp.size(), ps_.cp.rank());
  if (c_.model.mtp_num_layers > 0) add_context_parallel_shifts(mine, b, c_.model.mtp_num_layers, ps_.cp.size(), ps_.cp.rank());
  return mine;
}

at::Tensor Trainer::backward_loss(const MicroBatchLoss& result, int64_t micro_batches, bool per_token) const {
  if (per_token) return result.loss * result.tokens;  // summed; divided by the global batch's tokens with the gradients
  const int cp = ps_.cp.size();
  if (cp == 1) return result.loss / double(micro_batches);
  if (!result.tokens.defined()) {
    throw UserError("--context-parallel-size " + std::to_string(cp) +
                    ": the family's loss function counts no loss tokens, so the CP ranks' shares of its mean are unknown");
  }
  // Megatron's loss under CP: sum_rank / tokens_all x CP, so that the average over CP is the mean.
  const at::Tensor tokens = result.tokens.detach().to(at::kFloat);
  at::Tensor all = tokens.reshape({1}).clone();
  ps_.cp.all_reduce(all);
  return result.loss * (tokens * double(cp) / all.squeeze(0).clamp_min(1.0)) / double(micro_batches);
}

at::Tensor Trainer::forward_backward(int64_t micro_batches, const BatchFn& batch, bool forward_only) {
  const ModelConfig& m = c_.model;
  const int64_t family_terms = int64_t(loss_terms_.size()), model_terms = forward_only ? 0 : model_terms_.size();
  // [1 + terms + 1]: the loss, the terms, and the loss tokens counted.
  at::Tensor sums = at::zeros({1 + family_terms + model_terms + 1}, at::TensorOptions().device(device_));
  const bool per_token = t_.calculate_per_token_loss && !forward_only;
  // Per token, as Megatron: the router losses unscaled here, divided with the gradients.
  // --fp16: the losses enter backward multiplied by the loss scale.
  const at::Tensor loss_scale = scaler_ && !forward_only ? scaler_->scale() : at::Tensor();
  // Under CP the gradients are averaged over CP ranks holding parts of one sequence: CP times.
  const double moe_scale = per_token ? 1.0 : double(ps_.cp.size()) / double(micro_batches);
  for (auto& chunk : chunks_) chunk->set_moe_loss_scale(moe_scale, loss_scale);
  std::map<int64_t, Batch> batches;  // each micro-batch is loaded once, whichever chunks use it
  pipeline::StageFunctions f;
  f.forward = [&](int chunk, int64_t k, const at::Tensor& input) -> at::Tensor {
    auto it = batches.find(k);
    if (it == batches.end()) it = batches.emplace(k, to_device(batch(k), device_)).first;
    GPTModel& model = *chunks_[size_t(chunk)];
    if (!model.chunk().post_process) return model.forward(it->second.tokens, it->second.position_ids, it->second.attention_mask, input);
    const MicroBatchLoss result = loss_function_(model.token_losses(it->second, input), it->second);
    TORCH_CHECK(result.terms.size() == loss_terms_.size(), "the loss function returned ", result.terms.size(),
                " terms, its family declares ", loss_terms_.size());
    TORCH_CHECK(!per_token || result.tokens.defined(), "--calculate-per-token-loss: the loss function returned no token count");
    const at::Tensor loss = backward_loss(result, micro_batches, per_token);
    // [0] the loss summed over the tokens, [last] the tokens: the reported loss is their ratio.
    // A loss function that counts no tokens weighs its micro-batches alike.
    if (result.tokens.defined()) {
      sums.select(0, 0).add_((result.loss * result.tokens).detach());
      sums.select(0, sums.size(0) - 1).add_(result.tokens.detach().to(sums.scalar_type()));
    } else {
      sums.select(0, 0).add_(result.loss.detach());
      sums.select(0, sums.size(0) - 1).add_(1.0);
    }
    for (size_t i = 0; i < loss_terms_.size(); ++i) {
      auto term = result.terms.find(loss_terms_[i]);
      TORCH_CHECK(term != result.terms.end(), "the loss function returned no term '", loss_terms_[i], "', which its family declares");
      sums.select(0, int64_t(i) + 1).add_(term->second.detach() / double(micro_batches));
    }
    return loss_scale.defined() ? loss * loss_scale : loss;
  };
  if (!forward_only) {
    f.before_backward = [this](int chunk, bool last) {
      for (ParamAndGradBuffer* b : buffers()) b->set_last_micro_batch(chunk, last);
    };
  }
  if (!forward_only && !memory_reported_) {
    step_start_bytes_ = allocated_bytes(device_);
    f.after_forward = [this] {
      const int64_t now = allocated_bytes(device_);
      peak_sampled_bytes_ = std::max(peak_sampled_bytes_, now);
      peak_activation_bytes_ = std::max(peak_activation_bytes_, now - step_start_bytes_);
    };
  }
  pipeline::ScheduleOptions o;
  o.micro_batches = micro_batches;
  o.chunks = static_cast<int>(chunks_.size());
  o.forward_only = forward_only;
  const bool sp = c_.parallel.sequence_parallel;
  const int64_t rank_tokens = m.seq_length / ps_.cp.size();  // this rank's two chunks
  o.activation_shape = {sp ? rank_tokens / ps_.tp.size() : rank_tokens, t_.micro_batch_size, m.hidden_size};
  o.activation_options = at::TensorOptions().device(device_).dtype(params_dtype(t_));
  const pipeline::ScheduleStats stats = pipeline::forward_backward(f, o, ps_.pp);
  if (!forward_only) max_in_flight_ = std::max(max_in_flight_, stats.max_in_flight);
  if (model_terms > 0) model_terms_.collect(chunks(), sums.narrow(0, 1 + family_terms, model_terms), ps_.tp);
  return sums;
}

double Trainer::evaluate(SampleSource& source, int64_t& consumed) {
  for (auto& chunk : chunks_) chunk->eval();
  at::NoGradGuard no_grad;
  const int64_t dp_block = int64_t(t_.micro_batch_size) * ps_.dp.size();
  const int64_t micro_batches = t_.global_batch_size / dp_block;
  // [the loss summed over the tokens, the tokens] over every iteration: Megatron's evaluate
  // weighs every loss token of the validation batches alike.
  at::Tensor total = at::zeros({2}, at::TensorOptions().device(device_).dtype(at::kDouble));
  for (int64_t i = 0; i < t_.eval_iters; ++i) {
    const int64_t base = consumed + int64_t(t_.micro_batch_size) * ps_.dp.rank();
    const at::Tensor sums =
        forward_backward(micro_batches, [&](int64_t k) { return rank_batch(source, base + k * dp_block); }, /*forward_only=*/true)
            .to(at::kDouble);
    total[0] += sums[0];
    total[1] += sums[sums.size(0) - 1];
    consumed += micro_batches * dp_block;
  }
  for (auto& chunk : chunks_) chunk->train();
  const at::Tensor global = global_loss(total);
  return global[0].item<double>() / std::max(1.0, global[1].item<double>());
}

int Trainer::evaluate_splits() {
  if (t_.eval_iters <= 0) {
    throw UserError("megatron eval: --eval-iters is " + std::to_string(t_.eval_iters) +
                    "; give the number of global batches to evaluate on each split");
  }
  std::unique_ptr<SampleSource> test_data = make_sample_source(c_, Split::Test);
  if (!valid_data_ && !test_data) {
    throw UserError("megatron eval: no validation or test data; give --mock-data, or --data-path with a --split that "
                    "leaves samples to the validation or test split (e.g. 98,2,0), or --valid-data-path / --test-data-path");
  }
  const std::pair<SampleSource*, const char*> splits[] = {{valid_data_.get(), "val"}, {test_data.get(), "test"}};
  for (const auto& [source, name] : splits) {
    if (source == nullptr) continue;
    int64_t consumed = 0;  // from the split's first sample: every checkpoint is scored on the same batches
    metrics_->log_validation(progress_.iteration, progress_.consumed_train_samples, evaluate(*source, consumed), name);
  }
  return 0;
}

}  // namespace megatron
