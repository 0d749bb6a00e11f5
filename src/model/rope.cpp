#include "model/rope.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

namespace megatron {

int64_t rope_rotary_dim(const ModelConfig& c) {
  return c.multi_latent_attention ? c.qk_pos_emb_head_dim : static_cast<int64_t>(c.kv_channels * c.rotary_percent);
}

bool uses_yarn(const ModelConfig& c) { return c.rope_type == "yarn" || (c.rope_type.empty() && c.multi_latent_attention); }

double yarn_get_mscale(double factor, double mscale) { return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

namespace {

// YaRN: the frequencies that turn fewer than beta_slow times over the original context are
// divided by the factor, those turning more than beta_fast times kept, the band between blended
// linearly (HF's _compute_yarn_parameters, Megatron's YarnRotaryEmbedding).
at::Tensor yarn_inverse_frequencies(const ModelConfig& c, int64_t dim) {
  const double base = c.rotary_base, factor = c.rotary_scaling_factor;
  const at::Tensor pos_freqs = at::pow(base, at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim));
  const at::Tensor extrapolated = 1.0 / pos_freqs, interpolated = 1.0 / (factor * pos_freqs);
  // The channel pair whose wavelength turns `rotations` times over the original context.
  auto correction_dim = [&](double rotations) {
    return double(dim) * std::log(c.yarn_original_max_position_embeddings / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
  };
  const double low = std::max(std::floor(correction_dim(c.yarn_beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(c.yarn_beta_slow)), double(dim - 1));
  if (low == high) high += 0.001;  // no division by zero
  const at::Tensor ramp = ((at::arange(dim / 2, at::kFloat) - low) / (high - low)).clamp(0.0, 1.0);
  return interpolated * ramp + extrapolated * (1.0 - ramp);
}

}  // namespace

at::Tensor rope_inverse_frequencies(const ModelConfig& c) {
  const int64_t rot_dim = rope_rotary_dim(c);
  if (uses_yarn(c)) return yarn_inverse_frequencies(c, rot_dim);
  // 1 / base^(2i / rot_dim), computed in fp32 like the references so tables agree bit for bit.
  at::Tensor exponents = at::arange(0, rot_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(rot_dim);
  at::Tensor inv_freq = 1.0 / at::pow(c.rotary_base, exponents);
  if (!c.use_rope_scaling) return inv_freq;

  // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between
  // interpolated smoothly.
  const double old_len = c.rope_original_max_position_embeddings;
  const double low_wavelen = old_len / c.rope_low_freq_factor;
  const double high_wavelen = old_len / c.rope_high_freq_factor;
  at::Tensor wavelen = 2.0 * M_PI / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / c.rope_scaling_factor, inv_freq);
  at::Tensor smooth = (old_len / wavelen - c.rope_low_freq_factor) / (c.rope_high_freq_factor - c.rope_low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / c.rope_scaling_factor + smooth * scaled;
  at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return at::where(medium, smoothed, scaled);
}

RopeTables make_rope_tables(const ModelConfig& c, int64_t seq_len, const at::Device& device) {
  at::Tensor inv_freq = rope_inverse_frequencies(c);                        // [rot/2]
  at::Tensor positions = at::arange(seq_len, at::kLong).to(at::kFloat);     // [s]
  // --rotary-seq-len-interpolation-factor: positions slowed down (Megatron multiplies by the
  // reciprocal; HF's "linear" rope divides the frequencies, the same up to rounding).
  if (c.rotary_seq_len_interpolation_factor != 1.0) positions = positions * (1.0 / c.rotary_seq_len_interpolation_factor);
  at::Tensor freqs = at::outer(positions, inv_freq);                        // [s, rot/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1).view({seq_len, 1, 1, -1});   // [s, 1, 1, rot]
  if (uses_yarn(c)) {
    const double concentration = yarn_get_mscale(c.rotary_scaling_factor, c.mscale) /
                                 yarn_get_mscale(c.rotary_scaling_factor, c.mscale_all_dim);
    return {(emb.cos() * concentration).to(device), (emb.sin() * concentration).to(device)};
  }
  return {emb.cos().to(device), emb.sin().to(device)};
}

RopeTables gather_rope_tables(const RopeTables& t, const at::Tensor& position_ids) {
  at::Tensor index = position_ids.t();                                      // [s, b]
  // Contiguous once here rather than in every layer (indexing by a transposed index may return
  // a permuted layout).
  return {t.cos.squeeze(1).index({index}).contiguous(), t.sin.squeeze(1).index({index}).contiguous()};  // [s, b, 1, rot]
}

at::Tensor apply_rope(const at::Tensor& x, const RopeTables& t) {
  const int64_t rot_dim = t.cos.size(-1);
  const int64_t seq = x.size(0);
  at::Tensor cos = t.cos.narrow(0, 0, seq).to(x.scalar_type());
  at::Tensor sin = t.sin.narrow(0, 0, seq).to(x.scalar_type());
  at::Tensor rot = x.narrow(-1, 0, rot_dim);
  auto halves = rot.chunk(2, -1);
  at::Tensor rotated = at::cat({-halves[1], halves[0]}, -1);                // rotate_half
  at::Tensor out = rot * cos + rotated * sin;
  if (rot_dim == x.size(-1)) return out;
  return at::cat({out, x.narrow(-1, rot_dim, x.size(-1) - rot_dim)}, -1);
}

}  // namespace megatron
