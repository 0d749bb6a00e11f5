// Tensor-parallel linear layers and the vocab-parallel embedding, named as Megatron-Core
// (Transformer Engine) names them so parameter names match Megatron checkpoints
// (`linear_qkv.weight`, `linear_qkv.layer_norm_weight`, ...). Shapes are this rank's shard.
//
// Without sequence parallelism the activations between layers are whole on every TP rank;
// with it they are [s/tp, b, h] slices, gathered before a column-parallel layer and
// reduce-scattered after a row-parallel one.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <optional>

#include "distributed/process_group.h"
#include "kernels/gemv_ops.h"
#include "model/norm.h"
#include "tensor_parallel/fp8_linear.h"
#include "tensor_parallel/parameters.h"
#include "tensor_parallel/random.h"

namespace megatron::tp {

struct TensorParallel {
  dist::Group group;               // the TP peers (a group of one: no parallelism)
  bool sequence_parallel = false;
  std::shared_ptr<RngTracker> rng;  // dropout inside the TP region; null: the default generators
  // The expert-parallel peers of the MoE layers (ParallelState::ep): each holds
  // num_experts / size() of every MoE layer's experts. A group of one: all experts here.
  dist::Group experts;
  // The ranks splitting each expert's weights (expert tensor parallelism, ParallelState::expert_tp):
  // the MoE layer gathers its tokens over them. With --expert-tensor-parallel-size = TP the TP
  // group itself; a group of one: experts whole.
  dist::Group expert_group;
  // The replicas of the dense parameters, data x context parallel (ParallelState::dp_cp):
  // global_aux_loss counts experts over the whole batch, FP8 amaxes and expert-bias counts are
  // reduced over them.
  dist::Group data;
  // The context-parallel peers (ParallelState::cp): each holds 2 of the sequence's 2 x CP chunks;
  // core attention exchanges keys and values with them, the routers' load counts sum over them.
  dist::Group context;
  // Its two levels under --cp-comm-type a2a+p2p (ParallelState::cp_a2a, cp_p2p): heads traded
  // among the first, keys and values passed around a ring among the second. Trivial without.
  dist::Group context_a2a, context_p2p;
  int size() const { return group.size(); }
  int rank() const { return group.rank(); }
  // The group a parameter's ShardSpec splits it over: expert_group for experts, else group.
  const dist::Group& split_group(const ParamInfo& info) const { return info.expert >= 0 ? expert_group : group; }
  // draw() under the model-parallel generator when `inside` the TP region and there is one.
  at::Tensor random(bool inside, const std::function<at::Tensor()>& draw) const {
    return inside && rng ? rng->fork(draw) : draw();
  }
};

// How a linear layer's parameters are made: on which device (kMeta describes them without
// allocating memory), the weight's initialisation, and for a column-parallel layer whether its
// output is two gated halves split separately (SwiGLU's [gate; up]); and whether its GEMMs run
// in FP8 (the context of its model chunk's FP8 layers, null: in the weight's dtype).
struct LinearOptions {
  at::Device device = at::kCPU;
  Init weight_init = Init::Normal;
  bool gated = false;
  std::shared_ptr<fp8::Fp8Context> fp8;
};

// Y = X A^T with A split by output rows: [..., in] -> [..., out/tp].
class ColumnParallelLinear : public DescribedModule {
 public:
  ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias, const TensorParallel& tp,
                       const LinearOptions& options = {});
  // x: [s, b, in] ([s/tp, b, in] with sequence parallelism) -> [s, b, out/tp]
  at::Tensor forward(const at::Tensor& x) const;
  // swiglu(forward(x)) for SwiGLU's fc1 ([gate; up] columns of this rank): [s, b, out/tp/2]. One
  // row without gradient, bias or FP8 (a batch-1 decode step) takes one GEMV with the activation
  // in its epilogue (kernels::linear_swiglu).
  at::Tensor forward_swiglu(const at::Tensor& x) const;
  // forward(pending's RMSNorm output) (gated: forward_swiglu) with the norm in the GEMV
  // (kernels::gemv_after_norm): one row without gradient, FP8 or sequence parallelism; nullopt
  // where it cannot. -> the residual sum and the output.
  std::optional<kernels::NormedLinear> forward_after_norm(const PendingNorm& pending, bool gated) const;
  // Whether forward(x) is at::linear(x, weight, bias) on the row as given: no FP8, no sequence
  // parallelism's gather (a caller may then run the product in a kernel of its own).
  bool computes_plain_linear() const { return !fp8 && !tp_.sequence_parallel; }

  at::Tensor weight;  // [out/tp, in]
  at::Tensor bias;    // [out/tp] or undefined
  std::shared_ptr<Fp8Linear> fp8;  // the GEMMs in FP8 (LinearOptions::fp8), else null

 protected:
  at::Tensor enter(const at::Tensor& x) const;  // into the column-parallel region
  TensorParallel tp_;
};

// A column-parallel layer holding the parameters of the norm in front of it (TE's
// LayerNormColumnParallelLinear layout and names). The decoder layer applies that norm itself
// (norm()), fused with the residual add where it can, so forward() is the plain column-parallel
// one on already normalised input.
class LayerNormColumnParallelLinear : public ColumnParallelLinear {
 public:
  LayerNormColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias, const NormSpec& norm,
                                const TensorParallel& tp, const LinearOptions& options = {});
  NormParams norm() const { return {layer_norm_weight, layer_norm_bias, norm_.kind, norm_.eps, norm_.zero_centered_gamma}; }

  at::Tensor layer_norm_weight;  // [in], replicated
  at::Tensor layer_norm_bias;    // [in] for LayerNorm, undefined for RMSNorm

 private:
  NormSpec norm_;
};

// Y = X A^T with A split by input columns: [..., in/tp] -> [..., out], summed over TP.
class RowParallelLinear : public DescribedModule {
 public:
  RowParallelLinear(int64_t in_features, int64_t out_features, bool bias, const TensorParallel& tp,
                    const LinearOptions& options = {});
  // x: [s, b, in/tp] -> [s, b, out] ([s/tp, b, out] with sequence parallelism)
  at::Tensor forward(const at::Tensor& x) const;
  // residual + forward(x) with `next` (an RMSNorm) prepared in the GEMV's epilogue
  // (kernels::gemv_into_norm): one row without gradient, bias, FP8, sequence parallelism or a TP
  // reduction (one rank: the add cannot wait for the other ranks' shares); nullopt where it cannot.
  std::optional<kernels::PreparedNorm> forward_into_norm(const at::Tensor& x, const at::Tensor& residual, const NormParams& next) const;

  at::Tensor weight;  // [out, in/tp]
  at::Tensor bias;    // [out], replicated; added after the reduction
  std::shared_ptr<Fp8Linear> fp8;  // the GEMMs in FP8 (LinearOptions::fp8), else null

 private:
  TensorParallel tp_;
};

// The description of a replicated parameter whose gradient is a partial sum over TP when the
// layer runs on sequence shards (norm weights and biases, biases added after a reduce-scatter).
ParamInfo sequence_sharded_replica(const TensorParallel& tp, Init init);

// Lookup in a vocab-parallel table: weight [V/tp, h] holds rows [rank * V/tp, (rank+1) * V/tp).
// tokens [s, b] -> [s, b, h], summed over TP (each id is found on exactly one rank).
at::Tensor vocab_parallel_embedding(const at::Tensor& weight, const at::Tensor& tokens, const TensorParallel& tp);

}  // namespace megatron::tp
