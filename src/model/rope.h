// Rotary position embeddings (rotate-half form, as Megatron-Core and HF Llama), with
// --rotary-percent, Llama 3.1 frequency scaling and YaRN (--rope-type yarn, DeepSeek).
#pragma once

#include <ATen/core/Tensor.h>

#include "core/config.h"

namespace megatron {

// cos/sin tables for positions 0..seq_len-1, each [seq_len, 1, 1, rot_dim] in fp32, or, after
// gather_rope_tables, for each sample's own positions: [s, b, 1, rot_dim].
struct RopeTables {
  at::Tensor cos;  // [s, 1, 1, rot_dim] or [s, b, 1, rot_dim]
  at::Tensor sin;
};

// The channels of a head that rotate: the head's share by --rotary-percent, or under
// multi-latent attention its rotary part (--qk-pos-emb-head-dim).
int64_t rope_rotary_dim(const ModelConfig& config);
// rope or yarn: --rope-type, by default yarn under multi-latent attention (Megatron's MLA default).
bool uses_yarn(const ModelConfig& config);
// YaRN's magnitude correction: 0.1 * mscale * ln(factor) + 1, or 1 for factor <= 1.
double yarn_get_mscale(double factor, double mscale);

// Inverse frequencies [rot_dim / 2] in fp32, Llama 3.1 or YaRN scaling applied when configured.
at::Tensor rope_inverse_frequencies(const ModelConfig& config);

// With YaRN, cos and sin carry its concentration factor, get_mscale(factor, mscale) /
// get_mscale(factor, mscale_all_dim) (1 for DeepSeek's configurations, where the two are equal).
RopeTables make_rope_tables(const ModelConfig& config, int64_t seq_len, const at::Device& device);

// Rows of `tables` for position_ids [b, s] (positions restarting per packed document).
RopeTables gather_rope_tables(const RopeTables& tables, const at::Tensor& position_ids);

// x: [s, b, n, d]; rotates the first rot_dim channels of each head, passes the rest through.
at::Tensor apply_rope(const at::Tensor& x, const RopeTables& tables);

}  // namespace megatron
