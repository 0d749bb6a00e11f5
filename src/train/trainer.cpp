#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/nn/module.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <deque>
#include <optional>
#include <memory>
#include <filesystem>
#include <map>
#include <utility>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_export_ranks.h"
#include "checkpoint/hf_mapping.h"
#include "context_parallel/chunks.h"
#include "core/activation_offload.h"
#include "core/errors.h"
#include "core/memory.h"
#include "core/streams.h"
#include "data/batch.h"
#include "data/prefetcher.h"
#include "data/samples.h"
#include "distributed/parallel_state.h"
#include "distributed/world.h"
#include "model/family.h"
#include "model/gpt_model.h"
#include "moe/moe_config.h"
#include "optim/adamw.h"
#include "optim/grad_buffer.h"
#include "optim/grad_scaler.h"
#include "optim/lr_schedule.h"
#include "pipeline/layout.h"
#include "pipeline/schedules.h"
#include "tensor_parallel/sharding.h"
#include "train/grad_buffers.h"
#include "train/metrics.h"
#include "train/model_terms.h"
#include "train/precision.h"
#include "train/profiler.h"
#include "train/step_graph.h"
#include "train/batch_schedule.h"
#include "train/batch_transfer.h"
#include "train/rank_resources.h"
#include "train/checkpointer.h"
#include "train/divergence_check.h"
#include "train/stop_signal.h"

namespace megatron {
namespace {

// One rank's run: set-up (process groups, model, optimizer, data, checkpoint) and the loop.
class Trainer {
 public:
  Trainer(const Config& c, const dist::LaunchEnv& env, RunMode mode)
      : c_(c),
        t_(c.train),
        env_(env),
        mode_(mode),
        schedule_(c.train),
        decoupled_schedule_(decoupled_lr_schedule(c.train)),
        device_(pick_device(c.train, env)),
        ltor_(ltor_options(c)) {}
  ~Trainer() {
  }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  int run();
  // After run() returned normally: the communicators closed (destroy_process_group).
  void close() {
    for (ParamAndGradBuffer* b : buffers()) b->finish_param_gather();  // the last step's overlapped updates and all-gathers
    world_.shutdown();
  }

 private:
  using BatchFn = std::function<Batch(int64_t)>;
  // One iteration: forward and backward over the global batch, gradient sync, clip and AdamW at
  // the learning rate set on the optimizer. Enqueues device work without waiting for it, so the
  // whole of it can be captured as a CUDA graph.
  StepOutcome train_step(int64_t micro_batches, const BatchFn& batch);
  // --cuda-graph-impl local: train_step eagerly for the warm-up iterations, then captured once and
  // replayed, with each iteration's batch copied into the graph's inputs.
  StepOutcome graphed_step(int64_t micro_batches, const BatchFn& batch);
  // The mean loss over --eval-iters global batches of `source`, starting at sample `consumed`,
  // which it advances past them.
  double evaluate(SampleSource& source, int64_t& consumed);
  // `megatron eval`: the loaded weights on the first --eval-iters global batches of the validation
  // and test splits, the same batches for every checkpoint.
  int evaluate_splits();
  // One step's forward and backward passes (or forwards only) over `micro_batches` through
  // this rank's chunks under the pipeline schedule; `batch(k)` gives micro-batch k. Returns
  // [1 + loss terms + 1]: the micro-batch losses summed over their tokens, each named term (divided
  // by micro_batches), and the loss tokens counted, on the last stage; zeros elsewhere.
  at::Tensor forward_backward(int64_t micro_batches, const BatchFn& batch, bool forward_only);
  // Losses summed on this rank ([] or [n]: the loss and terms on the last stage, MoE router
  // losses on every stage) -> summed over the stages and averaged over DP replicas, on every
  // rank, fp64 on the device, the same shape.
  at::Tensor global_loss(const at::Tensor& sums);
  // Samples [first, first + micro-batch) of `source` as this rank trains on them: under context
  // parallelism its two chunks of each sequence.
  Batch rank_batch(const SampleSource& source, int64_t first) const;
  // The loss a micro-batch enters backward with (its mean over `tokens` loss tokens, divided by
  // the micro-batch count): under context parallelism each rank's share of the mean over every
  // CP rank's tokens, times CP (the gradients are averaged over CP).
  at::Tensor backward_loss(const MicroBatchLoss& result, int64_t micro_batches, bool per_token) const;
  void report_memory();
  std::vector<GPTModel*> chunks() const;
  std::vector<ParamAndGradBuffer*> buffers() const { return buffers_.all(); }  // dense, then MoE experts'
  void save(const char* why);
  // Throws the divergence check's error (after an asynchronous save of an earlier iteration has
  // finished) if an iteration's loss or gradient norm was not finite; `all`: up to the latest.
  void check_divergence(bool all);
  void check_weight_hash();
  bool prints_setup() const { return ps_.rank == 0; }
  // The samples the learning-rate schedule has counted: all consumed but, under --fp16, those of
  // skipped iterations (Megatron steps its scheduler on applied updates only).
  int64_t scheduled_samples() const { return progress_.consumed_train_samples - progress_.skipped_train_samples; }

  const Config& c_;
  const TrainConfig& t_;
  dist::LaunchEnv env_;
  RunMode mode_;
  // When the run began: --exit-duration-in-mins counts from here, as Megatron's from its start.
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  dist::World world_;
  dist::ParallelState ps_;
  LearningRateSchedule schedule_;
  std::optional<LearningRateSchedule> decoupled_schedule_;  // --decoupled-lr: the embedding and output layer
  at::Device device_;
  LtorOptions ltor_;
  std::vector<std::unique_ptr<GPTModel>> chunks_;  // this pipeline rank's model chunks (one unless interleaved)
  GradBuffers buffers_;                // declared after the model whose parameters they hold
  ParamAndGradBuffer* buffer_ = nullptr;  // buffers_.dense
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<GradScaler> scaler_;  // --fp16: the loss scale
  std::unique_ptr<SampleSource> train_data_, valid_data_;
  std::unique_ptr<BatchPrefetcher> train_batches_;  // declared after the sources it reads
  std::unique_ptr<StepProfiler> profiler_;
  std::unique_ptr<StepGraph> step_graph_;  // --cuda-graph-impl local
  int64_t graph_warmup_left_ = 0;
  std::vector<Batch> graph_inputs_;        // one per micro-batch, at fixed addresses
  // In the graph's pool, rewritten by every replay; statistics_ keeps the latest grad norm tensor,
  // which therefore reads as the latest iteration's when the statistics are taken.
  StepOutcome graph_result_;
  TrainingProgress progress_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<StopSignal> stop_;
  std::unique_ptr<DivergenceCheck> divergence_;  // --check-for-nan-in-loss-and-grad
  std::unique_ptr<TrainingMetrics> metrics_;
  LossFunction loss_function_;           // the family's, or masked_token_mean
  std::vector<std::string> loss_terms_;  // the names of its terms
  ModelTerms model_terms_;               // MTP and MoE router losses tracked for the log line (after loss_terms_)
  double flops_per_token_ = 0;


  // Memory, sampled after every forward until the first report (Megatron prints one after the
  // first log interval).
  bool memory_reported_ = false;
  int64_t step_start_bytes_ = 0;
  int64_t peak_sampled_bytes_ = 0;
  int64_t peak_activation_bytes_ = 0;
  int max_in_flight_ = 0;
};

std::vector<GPTModel*> Trainer::chunks() const {
  std::vector<GPTModel*> out;
  for (const auto& c : chunks_) out.push_back(c.get());
  return out;
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
    throw UserError("no training samples: --split " + c_.data.split + " leaves the training split empty");
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
                                                        (m.cp_comm_type.size() == 1 ? m.cp_comm_type[0] : "per layer") + ")"
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
    std::printf("> training data: %s\n", train_data_ ? train_data_->describe().c_str() : "none (--split leaves it empty)");
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

  stop_ = std::make_unique<StopSignal>(ps_, device_, t_.exit_duration_in_mins, started_);
  // As Megatron: under a dynamic loss scale an overflowing step is the scaler's signal.
  const bool dynamic_scale = scaler_ && scaler_->dynamic();
  divergence_ = std::make_unique<DivergenceCheck>(t_.check_for_nan_in_loss_and_grad && !dynamic_scale, device_);
  if (t_.check_for_nan_in_loss_and_grad && dynamic_scale && prints_setup() && mode_ == RunMode::Train) {
    std::printf("> note: --check-for-nan-in-loss-and-grad is off under --fp16's dynamic loss scale (a step that overflows is "
                "skipped and counted, as in Megatron)\n");
  }

  if (mode_ == RunMode::Evaluate) return evaluate_splits();

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
  const int64_t first_iteration = progress_.iteration + 1;
  while (progress_.iteration < t_.train_iters) {
    profiler_->before_iteration(progress_.iteration);
    for (ParamAndGradBuffer* b : buffers()) b->zero_grad();
    const int64_t consumed = progress_.consumed_train_samples, global_batch = batches.at(consumed);
    const int64_t micro_batches = global_batch / dp_block;
    const int64_t scheduled = scheduled_samples();
    optimizer_->set_learning_rate(schedule_.at_samples(scheduled), decoupled_schedule_ ? decoupled_schedule_->at_samples(scheduled) : 0.0);
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
                    "leaves samples to the validation or test split (e.g. 98,2,0)");
  }
  const std::pair<SampleSource*, const char*> splits[] = {{valid_data_.get(), "val"}, {test_data.get(), "test"}};
  for (const auto& [source, name] : splits) {
    if (source == nullptr) continue;
    int64_t consumed = 0;  // from the split's first sample: every checkpoint is scored on the same batches
    metrics_->log_validation(progress_.iteration, progress_.consumed_train_samples, evaluate(*source, consumed), name);
  }
  return 0;
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

}  // namespace

int run_training(const Config& config, const dist::LaunchEnv& env, RunMode mode) {
  Trainer trainer(config, env, mode);
  const int status = trainer.run();
  trainer.close();
  return status;
}

}  // namespace megatron
