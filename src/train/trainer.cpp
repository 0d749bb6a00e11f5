#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "checkpoint/hf_export_ranks.h"
#include "checkpoint/hf_mapping.h"
#include "context_parallel/chunks.h"
#include "core/activation_offload.h"
#include "core/errors.h"
#include "core/memory.h"
#include "core/streams.h"
#include "model/family.h"
#include "moe/moe_config.h"
#include "pipeline/layout.h"
#include "pipeline/schedules.h"
#include "tensor_parallel/sharding.h"
#include "train/batch_schedule.h"
#include "train/batch_transfer.h"
#include "train/precision.h"
#include "train/trainer_impl.h"

namespace megatron {

std::vector<GPTModel*> Trainer::chunks() const {
  std::vector<GPTModel*> out;
  for (const auto& c : chunks_) out.push_back(c.get());
  return out;
}

void Trainer::set_up_schedule() {
  const OptParamSchedulerState from_flags = opt_param_scheduler_state(t_);
  if (progress_.schedule && prints_setup()) {
    const char* how = t_.override_opt_param_scheduler        ? "the flags' (--override-opt-param-scheduler)"
                      : t_.use_checkpoint_opt_param_scheduler ? "the checkpoint's (--use-checkpoint-opt-param-scheduler)"
                                                              : "the checkpoint's, which the flags match";
    std::printf("> learning-rate schedule: %s, at sample %lld of it\n", how, static_cast<long long>(scheduled_samples()));
  } else if (progress_.schedule_start_samples > 0 && prints_setup()) {
    std::printf("> learning-rate schedule: starts over at iteration %lld (--no-load-optim: Megatron's scheduler is optimizer "
                "state)\n", static_cast<long long>(progress_.iteration));
  }
  if (!progress_.schedule) progress_.schedule = from_flags;
  schedule_ = LearningRateSchedule(t_, *progress_.schedule);
  decoupled_schedule_ = decoupled_lr_schedule(t_, *progress_.schedule);
  weight_decay_schedule_ = WeightDecaySchedule(*progress_.schedule);
}

int Trainer::run() {
  const ModelConfig& m = c_.model;
  at::set_num_threads(cpu_threads(t_));
  at::manual_seed(static_cast<uint64_t>(t_.seed));  // dropout draws from the default generators
  const std::string fp8_notice = check_fp8_device(m, device_);  // before any communicator: a refusal loses nothing
  if (!fp8_notice.empty() && env_.rank == 0) std::printf("> note: %s\n", fp8_notice.c_str());

  const ParallelConfig& p = c_.parallel;
  const std::string backend = !p.distributed_backend.empty() ? p.distributed_backend : device_.is_cuda() ? "nccl" : "gloo";
  world_ = dist::World::connect(env_, backend, std::chrono::milliseconds(static_cast<int64_t>(p.distributed_timeout_minutes * 60e3)));
  ps_ = dist::ParallelState::build(world_, p);

  tp::TensorParallel tensor_parallel{ps_.tp, p.sequence_parallel, nullptr};
  tensor_parallel.experts = ps_.ep;
  tensor_parallel.expert_group = ps_.expert_tp;
  tensor_parallel.data = ps_.dp_cp;
  tensor_parallel.context = ps_.cp;
  tensor_parallel.context_a2a = ps_.cp_a2a;
  tensor_parallel.context_p2p = ps_.cp_p2p;
  if (ps_.tp.size() > 1) {
    tensor_parallel.rng = std::make_shared<tp::RngTracker>(static_cast<uint64_t>(t_.seed), ps_.tp.rank(), device_.is_cuda());
  }
  const std::string model_memory = "allocating the model (--num-layers " + std::to_string(m.num_layers) + ", --hidden-size " +
                                   std::to_string(m.hidden_size) + ", --ffn-hidden-size " + std::to_string(m.ffn_hidden_size) +
                                   ", padded vocabulary " + std::to_string(m.padded_vocab_size) +
                                   "; a smaller model, or more tensor / pipeline-parallel ranks to split it)";
  allocating(model_memory, [&] {
    for (int v = 0; v < p.num_virtual_stages_per_pipeline_rank; ++v) {
      chunks_.push_back(std::make_unique<GPTModel>(m, tensor_parallel, pipeline::chunk_layers(p, m.num_layers, ps_.pp.rank(), v)));
    }
  });
  const auto init_start = std::chrono::steady_clock::now();
  initialize_chunks(chunks(), static_cast<uint64_t>(t_.seed));
  const double init_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - init_start).count();
  const int64_t fresh = t_.load_hf.empty() ? 0 : load_hf_weights(t_.load_hf, chunks());
  if (fresh > 0 && ps_.tp.rank() == 0 && ps_.dp.rank() == 0) {  // the last stage's first rank
    std::printf("> --load-hf: %lld multi-token prediction parameters are not in the checkpoint: they start from --seed\n",
                static_cast<long long>(fresh));
  }
  int64_t parameters = 0;
  for (auto& chunk : chunks_) {
    allocating(model_memory, [&] { chunk->to(device_, params_dtype(t_)); });
    chunk->train();
    // The other expert-parallel ranks hold as many experts again each.
    parameters += chunk->num_parameters() + chunk->num_expert_parameters() * (ps_.ep.size() - 1);
  }
  if (ps_.pp.size() > 1) {  // every stage's share
    at::Tensor count = at::full({1}, double(parameters), at::TensorOptions().device(device_).dtype(at::kDouble));
    ps_.pp.all_reduce(count);
    parameters = static_cast<int64_t>(count.item<double>());
  }
  const ModelFamily& family = family_of(m);
  flops_per_token_ = family.flops_per_token(m, parameters);
  loss_function_ = family.loss ? family.loss : LossFunction(masked_token_mean);
  loss_terms_ = family.loss_terms;
  model_terms_ = ModelTerms(m);

  buffers_ = make_grad_buffers(chunks(), c_, ps_, device_.is_cuda());
  buffer_ = buffers_.dense.get();
  // `megatron eval` never steps: no fp32 masters or moments (12 bytes per parameter in bf16).
  if (mode_ == RunMode::Train) optimizer_ = std::make_unique<AdamW>(buffers(), t_);
  if (mode_ == RunMode::Train && t_.fp16) scaler_ = std::make_unique<GradScaler>(t_, device_);
  if (buffer_->params_arrive_during_forward()) {
    for (auto& chunk : chunks_) {
      chunk->before_use = [this](const std::vector<at::Tensor>& params) {
        for (ParamAndGradBuffer* b : buffers()) b->wait_for_params(params);
      };
    }
  }

  // Data-parallel rank r takes micro-batch-size samples at offset r * micro-batch-size of every
  // micro-batch-size x DP block (Megatron's pretraining sampler).
  const int64_t dp_block = int64_t(t_.micro_batch_size) * ps_.dp.size();
  const int64_t dp_offset = int64_t(t_.micro_batch_size) * ps_.dp.rank();
  train_data_ = make_sample_source(c_, Split::Train);
  valid_data_ = make_sample_source(c_, Split::Valid);
  if (!train_data_ && mode_ == RunMode::Train) {
    throw UserError(c_.data.per_split_data() ? std::string("no training samples: pass --train-data-path")
                                             : "no training samples: --split " + c_.data.split + " leaves the training split empty");
  }
  train_batches_ = std::make_unique<BatchPrefetcher>(
      [this, dp_offset](int64_t first) {
        Batch b = rank_batch(*train_data_, first + dp_offset);
        return device_.is_cuda() ? pinned(b) : b;  // prepared on the prefetcher's thread
      },
      dp_block);

  if (prints_setup()) {
    std::printf("> %s\n", dist::describe(env_).c_str());
    const std::string virtual_stages =
        p.num_virtual_stages_per_pipeline_rank > 1 ? " (" + std::to_string(p.num_virtual_stages_per_pipeline_rank) + " virtual stages, interleaved 1F1B)"
        : ps_.pp.size() > 1                       ? " (1F1B)"
                                                  : "";
    const std::string experts = m.num_experts > 0 ? ", experts: expert tensor " + std::to_string(ps_.expert_tp.size()) +
                                                        " x expert parallel " + std::to_string(ps_.ep.size()) + " x expert data " +
                                                        std::to_string(ps_.expert_dp.size())
                                                  : "";
    const std::string context = ps_.cp.size() > 1 ? " x context " + std::to_string(ps_.cp.size()) + " (" +
                                                        (m.cp_comm_type.size() == 1 ? m.cp_comm_type[0] : "per layer") +
                                                        (ps_.cp_a2a.size() > 1 || ps_.cp_p2p.size() > 1
                                                             ? ": a2a " + std::to_string(ps_.cp_a2a.size()) + " x p2p " + std::to_string(ps_.cp_p2p.size())
                                                             : "") + ")"
                                                  : "";
    std::printf("> parallel layout: tensor %d x pipeline %d%s%s x data %d%s%s%s (%s)\n", ps_.tp.size(), ps_.pp.size(),
                virtual_stages.c_str(), context.c_str(), ps_.dp.size(), p.sequence_parallel ? ", sequence parallel" : "",
                p.use_distributed_optimizer ? ", distributed optimizer" : "", experts.c_str(), backend.c_str());
    std::fputs(moe::describe_moe(m).c_str(), stdout);
    std::printf("> model: %d layers, hidden %d, %d heads (%d query groups), ffn %d, vocab %d (padded %d), seq %d\n",
              m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size, m.vocab_size,
              m.padded_vocab_size, m.seq_length);
    std::printf("> number of parameters: %lld, %s on %s, %d CPU threads, %zu gradient bucket(s)\n",
                static_cast<long long>(parameters), describe_precision(t_, p).c_str(), device_.str().c_str(),
                at::get_num_threads(), buffer_->num_buckets() + (buffers_.experts ? buffers_.experts->num_buckets() : 0));
    std::fputs(describe_fp8(m).c_str(), stdout);
    std::printf("> initialised the weights in %.1f s\n", init_seconds);
    if (buffer_->overlap_optimizer_step()) {
      std::printf("> optimizer step: on a stream of its own, bucket by bucket, under the next forward\n");
    } else if (t_.overlap_optimizer_step) {
      std::printf("> optimizer step: not overlapped (--overlap-optimizer-step needs a CUDA device)\n");
    }
    if (m.recompute_granularity == "full") {
      std::printf("> activation recomputation: full, %s %d layer(s)%s\n",
                  m.recompute_method == "uniform" ? "groups of" : "the first", m.recompute_num_layers,
                  m.recompute_method == "uniform" ? "" : " of each model chunk");
    } else if (m.recompute_granularity == "selective") {
      std::printf("> activation recomputation: selective (core attention)\n");
    }
    if (m.cpu_offloading) {
      std::printf("> activation offload: the saved activations of layers 0-%d go to host memory in the forward and come "
                  "back in the backward%s\n",
                  m.cpu_offloading_num_layers - 1, device_.is_cuda() ? "" : " (on the CPU they are only copied: no memory is saved)");
    }
    std::printf("> training data: %s\n", train_data_ ? train_data_->describe().c_str() : "none");
  }

  checkpointer_ = std::make_unique<Checkpointer>(c_, ps_, device_);
  if (!t_.load.empty()) {
    if (auto loaded = load_checkpoint(t_.load, chunks(), optimizer_.get(), c_, ps_)) {
      progress_ = *loaded;
      checkpointer_->loaded(progress_.iteration);
      // Saved with the optimizer's state, as Megatron's: a fresh optimizer starts a fresh scale.
      if (scaler_ && progress_.grad_scaler && !t_.no_load_optim) scaler_->load_state(*progress_.grad_scaler);
    }
  }
  std::vector<std::string> logged_terms = loss_terms_;
  logged_terms.insert(logged_terms.end(), model_terms_.names().begin(), model_terms_.names().end());
  metrics_ = std::make_unique<TrainingMetrics>(c_, ps_, device_, flops_per_token_, logged_terms);

  stop_ = std::make_unique<StopSignal>(ps_, device_, t_.exit_duration_in_mins, started_, exit_signal_number(t_.exit_signal));
  // As Megatron: under a dynamic loss scale an overflowing step is the scaler's signal.
  const bool dynamic_scale = scaler_ && scaler_->dynamic();
  divergence_ = std::make_unique<DivergenceCheck>(t_.check_for_nan_in_loss_and_grad && !dynamic_scale, device_);
  if (t_.check_for_nan_in_loss_and_grad && dynamic_scale && prints_setup() && mode_ == RunMode::Train) {
    std::printf("> note: --check-for-nan-in-loss-and-grad is off under --fp16's dynamic loss scale (a step that overflows is "
                "skipped and counted, as in Megatron)\n");
  }

  if (mode_ == RunMode::Evaluate) return evaluate_splits();
  set_up_schedule();

  const GlobalBatchSchedule batches(t_, m.seq_length);
  if (t_.cuda_graph_impl == "local") {
    if (ps_.world_size > 1) {
      throw UserError("--cuda-graph-impl local captures the step of a single process; this run has " +
                      std::to_string(ps_.world_size) + " ranks (collectives inside a graph are not supported yet)");
    }
    step_graph_ = std::make_unique<StepGraph>(device_);  // from here on this thread runs on the graph's stream
    graph_warmup_left_ = t_.cuda_graph_warmup_steps;
  }
  std::optional<HighPriorityStream> training_stream;
  if (buffer_->overlap_optimizer_step() && !step_graph_) training_stream.emplace(device_);
  profiler_ = std::make_unique<StepProfiler>(t_, ps_.rank, device_);
  metrics_->start_interval();
  std::fflush(stdout);
  int64_t first_iteration = progress_.iteration + 1;  // logged whatever the interval
  while (progress_.iteration < t_.train_iters) {
    profiler_->before_iteration(progress_.iteration);
    for (ParamAndGradBuffer* b : buffers()) b->zero_grad();
    const int64_t consumed = progress_.consumed_train_samples, global_batch = batches.at(consumed);
    if (std::count(t_.iterations_to_skip.begin(), t_.iterations_to_skip.end(), progress_.iteration + 1) > 0) {
      // As Megatron: the batch is consumed and counted as skipped (the schedule stays), nothing
      // else happens: no step, log line, evaluation or save at this iteration.
      progress_.consumed_train_samples += global_batch;
      progress_.skipped_train_samples += global_batch;
      if (++progress_.iteration == first_iteration) ++first_iteration;
      if (prints_setup()) {
        std::printf("skipped iteration %lld (--iterations-to-skip): its %lld samples pass untrained\n",
                    static_cast<long long>(progress_.iteration), static_cast<long long>(global_batch));
      }
      continue;
    }
    const int64_t micro_batches = global_batch / dp_block;
    const int64_t scheduled = scheduled_samples();
    optimizer_->set_learning_rate(schedule_.at_samples(scheduled), decoupled_schedule_ ? decoupled_schedule_->at_samples(scheduled) : 0.0);
    optimizer_->set_weight_decay(weight_decay_schedule_.at_samples(scheduled));
    const BatchFn batch = [&](int64_t k) { return train_batches_->get(progress_.consumed_train_samples + k * dp_block); };
    const StepOutcome step = step_graph_ ? graphed_step(micro_batches, batch) : train_step(micro_batches, batch);
    // fp16 skips steps routinely (overflows while the scale settles), and the next learning rate
    // depends on it: read back here, as Megatron does every step.
    if (scaler_ && !step.applied.item<bool>()) progress_.skipped_train_samples += global_batch;
    progress_.consumed_train_samples += global_batch;
    metrics_->add_step(progress_.iteration + 1, schedule_.at_samples(scheduled), schedule_.at_samples(scheduled_samples()),
                       progress_.consumed_train_samples, global_batch, step);
    ++progress_.iteration;
    divergence_->add(progress_.iteration, step.loss, step.grad_norm);
    check_divergence(/*all=*/false);
    profiler_->after_iteration(progress_.iteration);

    // Megatron also logs the run's first iteration, whatever the interval.
    const bool first = progress_.iteration == first_iteration;
    if (progress_.iteration % t_.log_interval == 0 || first) {
      check_divergence(/*all=*/true);  // the line would show the non-finite loss; the error says more
      metrics_->log_iteration(progress_, schedule_.at_samples(scheduled_samples()), first);
      if (!memory_reported_) report_memory();
    }
    if (t_.check_weight_hash_across_dp_replicas_interval > 0 &&
        progress_.iteration % t_.check_weight_hash_across_dp_replicas_interval == 0) {
      check_weight_hash();
    }
    if (t_.eval_interval > 0 && t_.eval_iters > 0 && valid_data_ && progress_.iteration % t_.eval_interval == 0) {
      const double loss = evaluate(*valid_data_, progress_.consumed_valid_samples);
      metrics_->log_validation(progress_.iteration, progress_.consumed_train_samples, loss);
    }
    metrics_->exclude(checkpointer_->finish_async(/*wait=*/false));
    if (!t_.save.empty() && t_.save_interval > 0 && progress_.iteration % t_.save_interval == 0) save("save-interval");
    if (stop_->requested()) {
      check_divergence(/*all=*/true);
      if (stop_->signal() == StopSignal::kOutOfTime) {
        std::printf("exiting program after %.3f minutes (--exit-duration-in-mins), after iteration %lld\n", stop_->minutes_elapsed(),
                    static_cast<long long>(progress_.iteration));
      } else {
        std::printf("received signal %d: stopping after iteration %lld\n", stop_->signal(), static_cast<long long>(progress_.iteration));
      }
      if (!t_.save.empty()) save("signal");
      checkpointer_->finish_async(/*wait=*/true);
      return 0;
    }
    if (t_.exit_interval > 0 && progress_.iteration % t_.exit_interval == 0) {
      check_divergence(/*all=*/true);
      if (prints_setup()) std::printf("exiting program at iteration %lld (--exit-interval)\n", static_cast<long long>(progress_.iteration));
      if (!t_.save.empty()) save("exit-interval");
      checkpointer_->finish_async(/*wait=*/true);
      return 0;
    }
  }
  check_divergence(/*all=*/true);  // a run that ends diverged does not exit 0
  if (!t_.save.empty()) save("end of training");
  checkpointer_->finish_async(/*wait=*/true);
  if (!t_.save_hf.empty()) {
    for (ParamAndGradBuffer* b : buffers()) b->finish_param_gather();
    export_hf_from_ranks(chunks(), c_, ps_, device_);
  }
  return 0;
}

// FNV-1a over the bytes of this rank's parameters, compared across data-parallel replicas.
void Trainer::check_weight_hash() {
  buffer_->finish_param_gather();
  const at::Tensor bytes = buffer_->param_data.cpu().contiguous();
  const auto* data = static_cast<const uint8_t*>(bytes.data_ptr());
  uint64_t hash = 1469598103934665603ULL;
  for (size_t i = 0; i < bytes.nbytes(); ++i) hash = (hash ^ data[i]) * 1099511628211ULL;
  std::printf("> iteration %lld: weight hash %016llx (tensor-parallel rank %d, data-parallel rank %d)\n",
              static_cast<long long>(progress_.iteration), static_cast<unsigned long long>(hash), ps_.tp.rank(), ps_.dp.rank());
  std::fflush(stdout);
  at::Tensor mine = at::full({1}, static_cast<int64_t>(hash), at::TensorOptions().dtype(at::kLong).device(device_));
  // Context-parallel ranks hold replicas too.
  at::Tensor all = at::empty({ps_.dp_cp.size()}, mine.options());
  ps_.dp_cp.all_gather(all, mine);
  const at::Tensor all_cpu = all.cpu();
  for (int r = 0; r < ps_.dp_cp.size(); ++r) {
    if (all_cpu[r].item<int64_t>() != static_cast<int64_t>(hash)) {
      throw std::runtime_error("iteration " + std::to_string(progress_.iteration) + ": weights differ between data-parallel rank " +
                               std::to_string(ps_.dp_cp.rank()) + " and " + std::to_string(r));
    }
  }
}

// Megatron's report after the first log interval, from every rank of DP replica 0: memory now
// and at its peak, and what the activations kept for backward took at the schedule's peak.
void Trainer::report_memory() {
  memory_reported_ = true;
  if (ps_.dp.rank() != 0) return;
  const double mb = 1024.0 * 1024.0;
  const int64_t peak = max_allocated_bytes(device_);
  std::printf("[Rank %d] (after %lld iterations) memory (MB) | allocated: %.1f | max allocated: %.1f | "
              "activations at peak: %.1f | micro-batches in flight at peak: %d | pipeline stage: %d\n",
              ps_.rank, static_cast<long long>(progress_.iteration), allocated_bytes(device_) / mb,
              (peak >= 0 ? peak : peak_sampled_bytes_) / mb, peak_activation_bytes_ / mb, max_in_flight_, ps_.pp.rank());
  for (GPTModel* chunk : chunks()) {
    if (const ActivationOffloader* offloader = chunk->activation_offloader()) {
      const ActivationOffloader::Counts n = offloader->last_forward();
      std::printf("[Rank %d] activations offloaded to host memory per micro-batch: %.1f MB (%lld tensors in %lld storages "
                  "of the first %d layers)\n",
                  ps_.rank, n.bytes / mb, static_cast<long long>(n.tensors), static_cast<long long>(n.storages),
                  c_.model.cpu_offloading_num_layers);
    }
  }
  std::fflush(stdout);
}

void Trainer::check_divergence(bool all) {
  const std::optional<std::string> failure = all ? divergence_->check_all() : divergence_->check_lagged();
  if (!failure) return;
  checkpointer_->finish_async(/*wait=*/true);  // a save in flight is of an earlier iteration, checked finite
  throw UserError(*failure);
}

void Trainer::save(const char* why) {
  if (checkpointer_->saved(progress_.iteration)) return;
  check_divergence(/*all=*/true);  // nothing saved after a non-finite iteration
  metrics_->settle(progress_);  // the skipped-iteration counts go into the checkpoint
  if (scaler_ && scaler_->dynamic()) progress_.grad_scaler = scaler_->state();
  for (ParamAndGradBuffer* b : buffers()) b->finish_param_gather();
  metrics_->exclude(checkpointer_->save(progress_, chunks(), *optimizer_, why));  // keep saving out of the step time
}

int run_training(const Config& config, const dist::LaunchEnv& env, RunMode mode) {
  Trainer trainer(config, env, mode);
  const int status = trainer.run();
  trainer.close();
  return status;
}

}  // namespace megatron
