// One transformer layer against an independent composite reference written here with plain
// tensor ops: explicit per-position rotation angles, repeated K/V heads, an explicit causal
// mask and softmax. Outputs and gradients (input and every parameter) must agree.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <gtest/gtest.h>

#include <cmath>

#include "model/attention.h"
#include "model/mlp.h"
#include "model/transformer_layer.h"

namespace megatron {
namespace {

ModelConfig layer_config(bool qk_norm, bool qkv_bias, double rotary_percent) {
  ModelConfig c;
  c.num_layers = 1;
  c.hidden_size = 48;
  c.num_attention_heads = 6;
  c.num_query_groups = 2;
  c.kv_channels = 8;
  c.ffn_hidden_size = 80;
  c.seq_length = 10;
  c.normalization = "RMSNorm";
  c.norm_epsilon = 1e-6;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.add_qkv_bias = qkv_bias;
  c.qk_layernorm = qk_norm;
  c.position_embedding_type = "rope";
  c.rotary_base = 10000;
  c.rotary_percent = rotary_percent;
  c.hidden_dropout = c.attention_dropout = 0.0;
  return c;
}

at::Tensor rms(const at::Tensor& x, const at::Tensor& w, double eps) {
  return x / (x.pow(2).mean(-1, true) + eps).sqrt() * w;
}

// Rotation written per position and frequency: channel i pairs with i + rot/2.
at::Tensor reference_rope(const at::Tensor& x, const ModelConfig& c) {  // x: [s, b, n, d]
  const int64_t s = x.size(0), d = x.size(3), rot = int64_t(d * c.rotary_percent), half = rot / 2;
  at::Tensor out = x.clone();
  for (int64_t pos = 0; pos < s; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      const double theta = pos * std::pow(c.rotary_base, -2.0 * i / rot);
      at::Tensor a = x.select(0, pos).select(-1, i), b = x.select(0, pos).select(-1, i + half);
      out.select(0, pos).select(-1, i).copy_(a * std::cos(theta) - b * std::sin(theta));
      out.select(0, pos).select(-1, i + half).copy_(b * std::cos(theta) + a * std::sin(theta));
    }
  }
  return out;
}

at::Tensor reference_layer(const at::Tensor& x, TransformerLayer& layer, const ModelConfig& c) {
  const int64_t s = x.size(0), b = x.size(1), H = c.num_attention_heads, G = c.num_query_groups, d = c.kv_channels;
  auto& attn = dynamic_cast<SelfAttention&>(*layer.self_attention);
  at::Tensor h = rms(x, attn.fused_norm()->weight, c.norm_epsilon);
  at::Tensor qkv = at::matmul(h, attn.linear_qkv->weight.t());
  if (attn.linear_qkv->bias.defined()) qkv = qkv + attn.linear_qkv->bias;
  // Unfuse the per-group layout by indexing rows of the fused output explicitly.
  std::vector<at::Tensor> qs, ks, vs;
  const int64_t group_width = (H / G + 2) * d;
  for (int64_t g = 0; g < G; ++g) {
    at::Tensor grp = qkv.narrow(-1, g * group_width, group_width);
    for (int64_t j = 0; j < H / G; ++j) qs.push_back(grp.narrow(-1, j * d, d));
    ks.push_back(grp.narrow(-1, (H / G) * d, d));
    vs.push_back(grp.narrow(-1, (H / G + 1) * d, d));
  }
  at::Tensor q = at::stack(qs, 2), k = at::stack(ks, 2), v = at::stack(vs, 2);  // [s, b, n, d]
  if (c.qk_layernorm) {
    q = rms(q, attn.q_layernorm_weight, c.norm_epsilon);
    k = rms(k, attn.k_layernorm_weight, c.norm_epsilon);
  }
  q = reference_rope(q, c);
  k = reference_rope(k, c);
  k = k.repeat_interleave(H / G, 2);
  v = v.repeat_interleave(H / G, 2);
  at::Tensor scores = at::einsum("sbnd,tbnd->bnst", {q, k}) / std::sqrt(double(d));
  at::Tensor mask = at::ones({s, s}, at::kBool).triu(1);
  scores = scores.masked_fill(mask, -INFINITY);
  at::Tensor ctx = at::einsum("bnst,tbnd->sbnd", {scores.softmax(-1), v}).reshape({s, b, H * d});
  at::Tensor x1 = x + at::matmul(ctx, attn.linear_proj->weight.t());
  auto& mlp = dynamic_cast<MLP&>(*layer.mlp);
  at::Tensor f = at::matmul(rms(x1, mlp.fused_norm()->weight, c.norm_epsilon), mlp.linear_fc1->weight.t());
  at::Tensor gate = f.narrow(-1, 0, c.ffn_hidden_size), up = f.narrow(-1, c.ffn_hidden_size, c.ffn_hidden_size);
  return x1 + at::matmul(gate * gate.sigmoid() * up, mlp.linear_fc2->weight.t());
}

void check_layer(const ModelConfig& c) {
  at::manual_seed(7);
  TransformerLayer layer(c, tp::TensorParallel{}, gpt_layer_spec(c));
  layer.to(at::kDouble);
  {
    at::NoGradGuard g;
    for (auto& p : layer.parameters()) p.normal_(p.dim() == 1 ? 1.0 : 0.0, p.dim() == 1 ? 0.2 : 0.1);
  }
  RopeTables tables = make_rope_tables(c, c.seq_length, at::kCPU);
  at::Tensor x = at::randn({c.seq_length, 3, c.hidden_size}, at::kDouble).requires_grad_();
  at::Tensor upstream = at::randn({c.seq_length, 3, c.hidden_size}, at::kDouble);

  at::Tensor ours = layer.forward(x, &tables);
  auto params = layer.parameters();
  std::vector<at::Tensor> inputs = {x};
  inputs.insert(inputs.end(), params.begin(), params.end());
  auto grads_ours = torch::autograd::grad({ours}, inputs, {upstream});
  at::Tensor ref = reference_layer(x, layer, c);
  auto grads_ref = torch::autograd::grad({ref}, inputs, {upstream});

  // RoPE tables are fp32 in both paths' precision class; 1e-6 relative leaves room for that.
  EXPECT_LE((ours - ref).abs().max().item<double>(), 1e-5 * ref.abs().max().item<double>());
  auto names = layer.named_parameters();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const double scale = grads_ref[i].abs().max().item<double>();
    EXPECT_LE((grads_ours[i] - grads_ref[i]).abs().max().item<double>(), 1e-5 * scale)
        << "gradient of " << (i == 0 ? std::string("input") : names[i - 1].key());
  }
}

TEST(TransformerLayerReference, GroupedQueryAttention) { check_layer(layer_config(false, false, 1.0)); }
TEST(TransformerLayerReference, QkNormQkvBiasPartialRotary) { check_layer(layer_config(true, true, 0.5)); }

}  // namespace
}  // namespace megatron
