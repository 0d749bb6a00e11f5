// AdamW with fp32 master weights over the contiguous buffers of ParamAndGradBuffer. The model
// may hold bf16 or fp16 parameters; gradients arrive in fp32 `main_grad` (as Megatron names it),
// are clipped by the global L2 norm, and the fused AdamW kernel steps the fp32 masters, which are
// then copied back into the model's parameters. No weight decay on norms and biases (1-D).
// Megatron's precision-aware optimizer keeps the moments in bf16 (--exp-avg-dtype,
// --exp-avg-sq-dtype): 4 bytes a parameter instead of 8, the arithmetic still fp32; and the
// masters of bf16 parameters as 16-bit remainders of the bf16 weights (exact, 2 bytes not 4).
//
// With the distributed optimizer (ZeRO-1) each data-parallel rank owns a shard of every bucket:
// it keeps masters and moments for that shard only, steps it, and the buffer all-gathers the
// updated parameters. The gradient norm is summed over every shard in the world.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config.h"
#include "optim/grad_buffer.h"

namespace megatron {

class HostOptimizer;

// The part of one parameter this rank steps: elements [param_offset, param_offset + numel) of
// the flattened parameter (all of it without the distributed optimizer).
struct OptimizerParam {
  std::string name;
  at::Tensor model_param;   // the whole parameter, as the model holds it
  int64_t param_offset = 0;
  int64_t numel = 0;
  at::Tensor model_slice;   // [numel] view of the parameter's elements
  // [numel] fp32; model_slice itself when the model is fp32; int16 remainders completing the bf16
  // model_slice under the precision-aware optimizer (stores_param_remainders).
  at::Tensor master;
  at::Tensor main_grad;     // [numel] view into the gradient buffer (fp32; bf16 with --grad-reduce-in-bf16)
  at::Tensor exp_avg;       // [numel] fp32 (bf16: --use-precision-aware-optimizer --exp-avg-dtype bf16)
  at::Tensor exp_avg_sq;    // [numel] fp32 (bf16: ... --exp-avg-sq-dtype bf16)
  bool decay = true;        // weight decay applies
  bool decoupled_lr = false;  // the embedding or output layer under --decoupled-lr
  bool tp_duplicate = false;
  bool stage_copy = false;  // the tied output copy of the embedding on the last pipeline stage
  size_t buffer = 0;        // which of the optimizer's buffers holds the parameter (dense, expert)
  size_t bucket = 0;        // the gradient bucket of that buffer holding the parameter
  bool on_host = false;     // --optimizer-cpu-offload: master and moments in host memory (optim/host_optimizer.h)
  // On the host with remainder masters: the host's copy of the bf16 weights they complete.
  at::Tensor host_weights;
  bool whole() const { return param_offset == 0 && numel == model_param.numel(); }
  bool master_is_remainder() const { return master.scalar_type() == at::kShort; }
  at::Tensor master_fp32() const;  // [numel] fp32: `master`, or joined from the remainders
};

// Megatron's precision-aware optimizer keeps bf16 parameters' fp32 masters as the bf16 weight plus
// a 16-bit remainder (its store_param_remainders, on by default): 2 bytes a parameter, not 4.
bool stores_param_remainders(const TrainConfig& config);

class AdamW {
 public:
  AdamW(ParamAndGradBuffer& buffer, const TrainConfig& config);
  // Over several buffers (dense and expert parameters, reduced over different groups): one
  // step, one gradient norm, one clip over all of them.
  // `host_chunk_elements`: the offloaded step's staging chunk (0: the default; tests use small ones).
  AdamW(const std::vector<ParamAndGradBuffer*>& buffers, const TrainConfig& config, int64_t host_chunk_elements = 0);
  ~AdamW();

  // Global L2 norm of the (reduced) gradients over all TP, PP and DP shards: [] fp32 on the
  // buffer's device, not read back (a training step never waits for the host).
  at::Tensor grad_norm() const;
  // The learning rate of the next step(), written to the device without waiting for it (a step
  // captured as a CUDA graph reads it there on every replay); `decoupled_lr`: the embedding's and
  // output layer's under --decoupled-lr (ignored without it).
  void set_learning_rate(double lr, double decoupled_lr = 0.0);
  // The weight decay of the next step() (--weight-decay-incr-style). A kernel argument, not a
  // device value: a captured step keeps the one it was captured with (train refuses the pair).
  void set_weight_decay(double weight_decay) { c_.weight_decay = weight_decay; }
  // The L2 norm of the fp32 master weights (Megatron's calc_params_l2_norm: every parameter
  // once, whatever the layout), and the count of zero elements in the reduced gradients
  // (count_zeros_fp32): [] fp32 on the device each, not read back.
  at::Tensor params_norm() const;
  at::Tensor grad_zeros() const;
  // One AdamW step at the learning rate set last with the gradients clipped to --clip-grad by
  // `grad_norm` (Megatron's clip_grad_norm_, applied by the kernel as it reads each gradient),
  // then master -> model parameters (all-gathered over DP with the distributed optimizer).
  // `loss_scale` ([] fp32, --fp16): the gradients are its multiple (grad_norm is not), and the
  // kernel divides it out with the clip.
  // When grad_norm, or `loss` if given, is not finite the step is skipped on the device: no
  // element changes and the step count stays. Returns whether it was applied ([] bool, device).
  // Enqueues device work only, so it can be captured in a CUDA graph. With the buffer's
  // overlap_optimizer_step the updates run on a stream of their own, bucket by bucket, and
  // return before they finish: the buffer's wait_for_params / finish_param_gather wait for them.
  at::Tensor step(const at::Tensor& grad_norm, const at::Tensor& loss = {}, const at::Tensor& loss_scale = {});

  // Checkpoint state of this rank: "<param name>.master|exp_avg|exp_avg_sq" (the parameter's
  // shape when this rank steps all of it, else its flat slice) and "step".
  std::vector<NamedTensor> state() const;
  void load_state(const std::vector<NamedTensor>& state, bool load_moments);
  // Where each partial slice starts in its flattened parameter ("offset/<name>" -> offset), for
  // the checkpoint's metadata.
  std::map<std::string, std::string> state_offsets() const;
  // Loads from another layout: slice(name, field, offset, numel) returns elements [offset,
  // offset + numel) of this TP rank's flattened shard of the parameter's `field` (master,
  // exp_avg, exp_avg_sq): the part this rank steps.
  void load_resharded(const std::function<at::Tensor(const std::string&, const std::string&, int64_t, int64_t)>& slice,
                      const at::Tensor& step);
  int64_t steps_taken() const;
  // Masters := model parameters (after loading weights without optimizer state).
  void reset_from_model();

  std::vector<OptimizerParam>& params() { return params_; }

 private:
  void copy_master_to_model();
  // The model weights to every DP rank (distributed optimizer): starts the all-gathers of each
  // buffer's buckets [0, not_started[buffer]), from the last down, as the buckets already
  // started were, so every DP rank issues the same sequence; then waits for all unless they
  // overlap the next forward.
  void gather_params(std::vector<size_t> not_started);
  std::vector<size_t> no_buckets_started() const;
  ParamAndGradBuffer& first_buffer() const { return *buffers_.front(); }

  std::vector<ParamAndGradBuffer*> buffers_;
  std::vector<OptimizerParam> params_;
  // [] fp32 on the device: steps applied, shared by all parameters (they always step together);
  // "step" in checkpoints. On the device because whether a step applies is known only there.
  at::Tensor steps_;
  // Per buffer, the sum over its parameters of `per_param` (each parameter counted once over TP
  // replicas and tied copies), added over the world: [] fp32.
  at::Tensor sum_over_model(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& per_buffer,
                            const std::function<at::Tensor(const OptimizerParam&)>& field) const;

  at::Tensor lr_;  // [] fp64 on the device: set_learning_rate's value
  at::Tensor decoupled_lr_;  // [] fp64 on the device: the embedding's and output layer's (--decoupled-lr)
  // The stream the updates run on with the buffer's overlap_optimizer_step (a CUDA buffer).
  std::optional<c10::Stream> update_stream_;
  std::unique_ptr<HostOptimizer> host_;  // --optimizer-cpu-offload
  TrainConfig c_;
};

}  // namespace megatron
