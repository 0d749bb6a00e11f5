// The Trainer of `megatron train` / `megatron eval` (run_training, train/trainer.h): one rank's
// set-up, loop, checkpoints and reports in trainer.cpp; a step's forward and backward, the
// optimizer step and evaluation in trainer_step.cpp. Internal to those two files.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "data/batch.h"
#include "data/ltor_masks.h"
#include "data/prefetcher.h"
#include "data/samples.h"
#include "distributed/parallel_state.h"
#include "distributed/world.h"
#include "model/gpt_model.h"
#include "model/loss.h"
#include "optim/adamw.h"
#include "optim/grad_buffer.h"
#include "optim/grad_scaler.h"
#include "optim/lr_schedule.h"
#include "train/checkpointer.h"
#include "train/divergence_check.h"
#include "train/grad_buffers.h"
#include "train/metrics.h"
#include "train/model_terms.h"
#include "train/profiler.h"
#include "train/rank_resources.h"
#include "train/step_graph.h"
#include "train/stop_signal.h"
#include "train/trainer.h"

namespace megatron {

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
        weight_decay_schedule_(c.train),
        device_(pick_device(c.train, env)),
        ltor_(ltor_options(c)) {}
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
  // The samples the learning-rate schedule has counted: all consumed but those of skipped
  // iterations (--fp16's overflows, --iterations-to-skip: Megatron steps its scheduler on applied
  // updates only), counted from where a --no-load-optim resume started it over
  // (TrainingProgress::schedule_start_samples).
  int64_t scheduled_samples() const {
    return progress_.consumed_train_samples - progress_.skipped_train_samples - progress_.schedule_start_samples;
  }
  // The schedule the run goes on with (the flags', or what a resume decided) into schedule_,
  // decoupled_schedule_ and weight_decay_schedule_, and into progress_ for the checkpoints.
  void set_up_schedule();

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
  WeightDecaySchedule weight_decay_schedule_;
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

}  // namespace megatron
