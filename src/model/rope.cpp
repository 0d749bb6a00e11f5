#include "model/rope.h"

#include <ATen/ATen.h>

#include <cmath>

namespace megatron {

at::Tensor rope_inverse_frequencies(const ModelConfig& c) {
  const int64_t rot_dim = static_cast<int64_t>(c.kv_channels * c.rotary_percent);
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
  at::Tensor freqs = at::outer(positions, inv_freq);                        // [s, rot/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1).view({seq_len, 1, 1, -1});   // [s, 1, 1, rot]
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
