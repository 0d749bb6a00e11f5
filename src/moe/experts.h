// The experts of one MoE layer held by this rank (Megatron-Core's GroupedMLP / TEGroupedMLP):
// SwiGLU MLPs, one weight per expert under its global index (`linear_fc1.weight<e>`,
// `linear_fc2.weight<e>`), so checkpoints and the HF mapping name experts the same under any
// expert-parallel size. Under expert tensor parallelism (--expert-tensor-parallel-size, by
// default the TP size) each weight is split as the dense MLP's (fc1 by output rows, its gate and
// up halves apart; fc2 by input columns), and the output is a partial sum over the expert-TP
// ranks that the layer reduces. Under --fp8-format (an FP8 layer) the GEMMs are FP8 grouped
// GEMMs (moe/fp8_grouped_linear.h) on every device.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

#include "model/layer_spec.h"
#include "moe/fp8_grouped_linear.h"

namespace megatron::moe {

class GroupedExperts : public tp::DescribedModule {
 public:
  // Experts [first_expert, first_expert + count) of the layer.
  GroupedExperts(const PartContext& context, int first_expert, int count);
  // rows [N, h], grouped by expert: counts[e] rows for local expert e, in order -> [N, h].
  // counts: [E_local] int64 on the rows' device (the grouped GEMM never reads it on the host).
  at::Tensor forward(const at::Tensor& rows, const at::Tensor& counts) const;
  // For generation, after the model's last move (device, dtype): each linear's expert weights
  // moved into one [E_local, out, in] tensor, every parameter a view of its row, so the grouped
  // GEMM reads them in place instead of stacking a copy of them all every forward (in training the
  // gradient buffer lays them out so). Not for a model whose parameters a gradient buffer holds.
  void pack_weights();

  std::vector<at::Tensor> fc1;  // [2f/etp, h] per local expert: [gate block; up block] of this rank
  std::vector<at::Tensor> fc2;  // [h, f/etp]

 private:
  at::Tensor grouped(const at::Tensor& rows, const at::Tensor& counts) const;  // CUDA: at::_grouped_mm
  // The MLP over the grouped rows, its two linears functions of (input, the experts' row ends).
  using GroupedGemm = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;
  at::Tensor mlp(const at::Tensor& rows, const at::Tensor& ends, const GroupedGemm& linear1, const GroupedGemm& linear2) const;
  at::Tensor activation(const at::Tensor& h) const;  // SwiGLU: [n, 2f/tp] -> [n, f/tp]
  // --recompute-modules moe_act: the SwiGLU output fc2 keeps is freed after fc2's forward and made
  // again from fc1's output (which the SwiGLU keeps anyway) when fc2's backward begins.
  void discard_activation(const at::Tensor& act, const at::Tensor& fc2_out, const at::Tensor& fc1_out) const;
  std::unique_ptr<Fp8GroupedLinear> fp8_fc1_, fp8_fc2_;  // --fp8-format: the FP8 grouped GEMMs, else null
  bool grouped_gemm_;
  bool swiglu_fusion_;
  bool recompute_activation_;
};

}  // namespace megatron::moe
