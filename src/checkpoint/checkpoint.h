// Training checkpoints: model weights, optimizer state (fp32 masters and Adam moments), RNG
// states and the training position, in safetensors files plus a JSON file.
//
//   <save>/iter_0000100/model.safetensors      parameters under Megatron-Core names
//   <save>/iter_0000100/optimizer.safetensors  "<param>.master|exp_avg|exp_avg_sq", "step"
//   <save>/iter_0000100/rng.safetensors        generator states
//   <save>/iter_0000100/state.json             iteration, consumed samples, counters, config, layout
//   <save>/latest_checkpointed_iteration.txt   written last
//
// A parallel job writes one file per part instead: model_tpTT_ppPPP.safetensors (this TP
// rank's shards of the pipeline stage's parameters, all its model chunks, from DP rank 0),
// optimizer_tpTT_ppPPP.safetensors (or ..._dpDDD with the distributed optimizer, one per DP
// shard) and rng_rankRRRRR.safetensors. Under expert parallelism each EP rank's experts (and,
// without the distributed optimizer, their optimizer state) go to ..._epEEE files instead. Names are global (`decoder.layers.<global index>`), so
// the same layout reads its own files and any other layout reshards (reshard.h).
//
// An iteration directory is assembled under a temporary name and renamed when complete; the
// tracker file is replaced atomically afterwards, so a crash never leaves a partial checkpoint
// under a final name and the previous checkpoint stays loadable.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "core/config.h"
#include "checkpoint/safetensors.h"
#include "distributed/parallel_state.h"
#include "optim/grad_scaler.h"
#include "optim/lr_schedule.h"
#include "tensor_parallel/parameters.h"

namespace megatron {

class GPTModel;
class AdamW;

struct TrainingProgress {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;
  // --fp16: the samples of skipped iterations. The learning-rate schedule counts only the samples
  // of applied updates, as Megatron steps its scheduler on successful updates only.
  int64_t skipped_train_samples = 0;
  // --fp16 with dynamic loss scaling: the scaler's state (saved with the optimizer's: not loaded
  // under --no-load-optim or --finetune).
  std::optional<GradScalerState> grad_scaler;
  // The learning-rate and weight-decay schedule (Megatron's opt_param_scheduler in state.json;
  // absent in checkpoints from before it was saved). After a load: the one to go on with,
  // resume_opt_param_scheduler's choice; unset under --no-load-optim, --finetune or an old
  // checkpoint (the flags').
  std::optional<OptParamSchedulerState> schedule;
  // The scheduled samples (consumed less skipped) at which the schedule started counting: 0 but
  // after a --no-load-optim resume, which starts it over as Megatron's (its scheduler is
  // optimizer state). The schedule stands at scheduled samples - this.
  int64_t schedule_start_samples = 0;
};

std::string iteration_directory(const std::string& save_dir, int64_t iteration);

// The iteration directory latest_checkpointed_iteration.txt names, or "" without a tracker.
std::string latest_checkpoint_directory(const std::string& load_dir);
// The iteration directory a load under `load_dir` reads: Megatron's --ckpt-step's when
// `ckpt_step` >= 0 (UserError naming the iterations saved there when it does not exist), else
// the tracker's ("" without one).
std::string checkpoint_directory_to_load(const std::string& load_dir, int64_t ckpt_step);
// state.json of an iteration directory (format version checked).
nlohmann::json read_checkpoint_state(const std::string& iteration_dir);
// The model `state` (read_checkpoint_state(iteration_dir)) records, checked field by field
// (hf_config_check.h): UserError naming state.json when missing, mistyped or impossible.
ModelConfig saved_model_config(const std::string& iteration_dir, const nlohmann::json& state);
// The model weights of an iteration directory, shapes checked. A model split over tensor-parallel
// ranks gets its rank's shards, resharded from the saved layout (each rank reads its own).
void load_model_weights(const std::string& iteration_dir, GPTModel& model,
                        const dist::ParallelState& ps = dist::ParallelState::single());

// A save in three steps, so the writing can run on a thread while training goes on (--async-save):
// snapshot_checkpoint (collective; with copy, host copies of everything, the only stall),
// write_checkpoint_files (this rank's files into the temporary directory; no communication),
// publish_checkpoint (collective: once every rank has written, rename into place, then the tracker).
struct CheckpointSnapshot {
  struct File {
    std::string name;
    std::vector<SafetensorsEntry> tensors;
    std::map<std::string, std::string> metadata;
  };
  std::string save_dir, final_dir, tmp_dir;
  int64_t iteration = 0;
  bool leader = false;
  int64_t keep_last_n = 0;
  std::vector<File> files;
  std::string state_json;  // the leader's
};
// `host_buffers` (optional) keeps the host copies of GPU tensors between saves, in page-locked
// memory: the copy then runs at PCIe speed and allocates only once.
// `chunks`: this rank's model chunks (one without an interleaved pipeline).
CheckpointSnapshot snapshot_checkpoint(const std::string& save_dir, const TrainingProgress& progress,
                                       const std::vector<GPTModel*>& chunks,
                                       const AdamW& optimizer, const Config& config, const dist::ParallelState& ps,
                                       bool copy, std::map<std::string, at::Tensor>* host_buffers = nullptr);
void write_checkpoint_files(const CheckpointSnapshot& snapshot);
void publish_checkpoint(const CheckpointSnapshot& snapshot, const dist::ParallelState& ps);

// All three at once. Collective: every rank of `ps` calls it.
void save_checkpoint(const std::string& save_dir, const TrainingProgress& progress, const std::vector<GPTModel*>& chunks,
                     const AdamW& optimizer, const Config& config,
                     const dist::ParallelState& ps = dist::ParallelState::single());

// Loads the latest checkpoint under `load_dir` into model and optimizer (and the RNGs unless
// --no-load-rng). Returns nothing, after saying so, when the directory has no checkpoint yet
// (as Megatron, a fresh start); throws UserError on a missing, truncated or mismatching one.
// `optimizer` may be null for a run that never steps (`megatron eval`), which must then load the
// weights alone (--finetune or --no-load-optim).
std::optional<TrainingProgress> load_checkpoint(const std::string& load_dir, const std::vector<GPTModel*>& chunks,
                                                AdamW* optimizer,
                                                const Config& config,
                                                const dist::ParallelState& ps = dist::ParallelState::single());

// A weights-only checkpoint at iteration 0, as `megatron convert` writes it: one model file per
// TP rank and pipeline stage from write_model_file(tp_rank, pp_rank, -1, path), and with expert
// parallelism one more per EP rank from write_model_file(tp_rank, pp_rank, ep_rank, path) that
// holds that rank's experts (the first file then the dense tensors only), `extra_files`
// (name in the directory -> source path) copied in, state.json and the tracker. `megatron
// train --load DIR --finetune` starts from it; it records `progress` (iter_N for iteration N),
// where `--load DIR --no-load-optim --no-load-rng` goes on (a Megatron-LM run's iteration and
// consumed samples: its data order and schedule continue). config.parallel gives the layout; `params`
// describes the tensors written (the model's parameter table). `check_before_publish` runs once
// every file is written, before anything is published: an error from it (or from any step before
// it) removes the partial directory, so nothing loadable is left behind.
void save_weights_checkpoint(const std::string& save_dir, const Config& config, const tp::ParamTable& params,
                             const std::function<void(int, int, int, const std::string&)>& write_model_file,
                             const std::map<std::string, std::string>& extra_files,
                             const std::function<void()>& check_before_publish = {},
                             const TrainingProgress& progress = TrainingProgress());

// The file name of a part of a multi-rank checkpoint: "model_tp01_pp000.safetensors", with
// dp_rank >= 0 (distributed-optimizer state) "optimizer_tp01_pp000_dp003.safetensors", with
// ep_rank >= 0 (an expert-parallel rank's experts and their optimizer state)
// "model_tp01_pp000_ep001.safetensors".
std::string checkpoint_part_name(const std::string& kind, int tp_rank, int pp_rank, int dp_rank = -1, int ep_rank = -1);

// The file of one part of a checkpoint ("model", "optimizer" or "rng") this rank writes/reads.
std::string checkpoint_file(const std::string& kind, const dist::ParallelState& ps, bool distributed_optimizer);

}  // namespace megatron
