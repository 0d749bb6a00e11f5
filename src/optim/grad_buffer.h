// Parameters and their gradients (fp32, as Megatron reduces them; bf16 with --grad-reduce-in-bf16)
// in contiguous buffers, reduced over data-parallel replicas in buckets (Megatron-Core's
// ParamAndGradBuffer + DistributedDataParallel).
//
// The model's parameters become views into `param_data`, so the distributed optimizer can
// all-gather them in place; each parameter's gradient is added into its `main_grad` view
// of `grad_data` by a hook the moment autograd produces it (the parameter's .grad is then
// dropped). Parameters are laid out in reverse registration order, roughly the order backward
// produces them, and grouped into buckets; during the last micro-batch a bucket's reduction
// (all-reduce, or reduce-scatter for the distributed optimizer) starts as soon as all its
// gradients are in (--overlap-grad-reduce), else all start after backward.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "distributed/parallel_state.h"
#include "tensor_parallel/parameters.h"

namespace megatron {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
  int chunk = 0;  // the pipeline model chunk holding it (interleaved schedule)
  tp::ParamInfo info = {};  // what the parameter is (the model's parameter_table()); default: dense, replicated
};

struct GradBufferOptions {
  int64_t bucket_size = 40000000;      // elements per bucket (Megatron's default)
  bool overlap_grad_reduce = false;
  bool distributed_optimizer = false;  // reduce-scatter: each DP rank keeps its shard of each bucket
  bool overlap_param_gather = false;   // all-gathers run into the next forward (see wait_for_params)
  // The optimizer steps bucket by bucket on a stream of its own while the next forward runs
  // (CUDA): each bucket's parameters are ready once its update event completes.
  bool overlap_optimizer_step = false;
  // Tied embedding and output weights split over the first and last pipeline stage: both hold
  // the word embedding (ParamInfo::word_embedding); it gets a bucket of its own (so with the distributed
  // optimizer both stages shard it alike) and its gradient is summed over ps.embedding.
  bool tied_embedding_across_stages = false;
  // Every parameter's main_grad is registered for tensor_parallel/grad_accumulation.h: a weight
  // going through tp::linear gets its gradient added there by the weight-gradient GEMM.
  bool gradient_accumulation_fusion = false;
  // main_grad (and so accumulation over micro-batches and the DP reduction) in bf16, not fp32.
  bool grad_reduce_in_bf16 = false;
  // The group the buffer's gradients are averaged over (and, with the distributed optimizer,
  // sharded across), as Megatron's DDP keeps dense and expert-parallel buffers apart: dense
  // parameters over ps.dp_cp, expert parameters over ps.expert_dp. Every parameter in the buffer
  // must name this group in its ParamInfo.
  tp::GradGroup grad_group = tp::GradGroup::DataParallel;
};


struct BufferedParam {
  std::string name;
  at::Tensor param;       // the model's parameter, a view into param_data
  at::Tensor main_grad;   // fp32 (bf16 with grad_reduce_in_bf16), the parameter's shape, a view into grad_data
  int64_t offset = 0;     // of the parameter in both buffers
  int64_t numel = 0;
  size_t bucket = 0;
  bool tp_duplicate = false;     // the same on every TP rank: counted once in norms
  bool tp_partial_grad = false;  // each TP rank holds a partial gradient: all-reduced across TP
  bool stage_copy = false;       // a copy of a weight another pipeline stage holds: not counted in norms
  bool tied_embedding = false;   // summed over the first and last pipeline stage
  int chunk = 0;
  // main_grad holds a gradient of this step (set by the first add after zero_grad(), which
  // overwrites instead of adding: the buffer is not zero-filled every step).
  bool has_grad = false;
};

class ParamAndGradBuffer {
 public:
  // One buffer per gradient group (options.grad_group): the parameters' ParamInfo must agree.
  ParamAndGradBuffer(const std::vector<NamedTensor>& params, const dist::ParallelState& ps, const GradBufferOptions& options);
  ~ParamAndGradBuffer();
  ParamAndGradBuffer(const ParamAndGradBuffer&) = delete;
  ParamAndGradBuffer& operator=(const ParamAndGradBuffer&) = delete;

  void zero_grad();
  // Reductions start from the hooks only during the last micro-batch of a step (of the model
  // chunk, under the interleaved schedule).
  void set_last_micro_batch(int chunk, bool last) { last_micro_batch_.at(size_t(chunk)) = last; }
  // Every bucket reduced and averaged over DP (with the distributed optimizer: this rank's
  // shard of each bucket), then partial TP gradients all-reduced, then tied embedding
  // gradients summed over the first and last pipeline stage.
  void finish_grad_sync();
  // Distributed optimizer: every rank's updated shard of a bucket to every DP replica. The
  // optimizer starts each bucket's gather as soon as it has stepped that bucket (first layers'
  // buckets first); every DP rank must start the buckets in the same order. finish waits for
  // all, wait_for_params for the buckets holding `params` only, so the next forward can start
  // while later layers still arrive.
  void start_param_gather(size_t bucket);
  void finish_param_gather();
  void wait_for_params(const std::vector<at::Tensor>& params);
  bool overlap_param_gather() const { return options_.overlap_param_gather; }
  // --overlap-optimizer-step: the optimizer stepped a bucket on its own stream; `updated` is
  // recorded there after the bucket's last kernel. wait_for_params and finish_param_gather make
  // the current stream wait for it, and so does the first gradient of the next backward written
  // into the bucket (the update reads main_grad).
  void set_params_updated(size_t bucket, c10::Event updated);
  bool overlap_optimizer_step() const { return options_.overlap_optimizer_step; }
  // Parameters may still be arriving when the next forward starts: the model must call
  // wait_for_params before it uses them.
  bool params_arrive_during_forward() const { return overlap_param_gather() || overlap_optimizer_step(); }

  // [begin, end) ranges of the buffers this DP rank's optimizer steps: its shard of every
  // bucket with the distributed optimizer, everything otherwise.
  std::vector<std::pair<int64_t, int64_t>> owned_ranges() const;
  std::vector<BufferedParam>& params() { return params_; }
  const std::vector<BufferedParam>& params() const { return params_; }
  const dist::ParallelState& parallel_state() const { return ps_; }
  const dist::Group& reduce_group() const { return reduce_group_; }  // ps.dp_cp or ps.expert_dp
  bool distributed_optimizer() const { return options_.distributed_optimizer; }
  size_t num_buckets() const { return buckets_.size(); }

  at::Tensor param_data;  // [N] in the parameters' dtype
  at::Tensor grad_data;   // [N] fp32

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // in the buffers; a multiple of DP long with the distributed optimizer
    std::vector<size_t> params;
    size_t pending = 0;          // gradients not yet in during the last micro-batch
    bool launched = false;
    dist::Work work;
    at::Tensor reduced;          // reduce-scatter output where the backend cannot write into the shard
    dist::Work gather;
    at::Tensor gathered_shard;   // all-gather input (a copy of the shard where the backend cannot alias)
    std::optional<c10::Event> updated;  // the optimizer's step of this bucket (overlap_optimizer_step)
  };
  friend struct GradReadyHook;
  void on_grad_ready(size_t index);  // the hook: .grad into main_grad, then grad_added
  void grad_added(size_t index);     // bucket bookkeeping once a micro-batch's gradient is in
  bool take_first_add(size_t index);  // whether this add is the step's first for the parameter (and marks it)
  void launch(Bucket& bucket);
  void wait_for_update(Bucket& bucket);  // the current stream waits for the bucket's optimizer step
  void wait_for_bucket(Bucket& bucket);  // ... and for its all-gather
  std::pair<int64_t, int64_t> shard_of(const Bucket& bucket) const;

  dist::ParallelState ps_;
  GradBufferOptions options_;
  dist::Group reduce_group_;  // where gradients are averaged: options_.grad_group's group of ps_
  std::vector<BufferedParam> params_;
  std::vector<Bucket> buckets_;
  std::map<const void*, size_t> bucket_of_;  // parameter (TensorImpl) -> its bucket
  std::vector<bool> last_micro_batch_;  // per model chunk
};

}  // namespace megatron
