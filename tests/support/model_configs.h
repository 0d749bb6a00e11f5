// Small Llama-shaped models for tests: RMSNorm, SwiGLU, RoPE, grouped-query attention, no
// biases, no dropout, untied output layer; only the sizes differ from test to test. And one MoE
// layer's configuration for tests of the experts.
#pragma once

#include "core/config.h"

namespace megatron::test {

struct LlamaSizes {
  int hidden, heads, groups, ffn, seq, vocab;
  int layers = 2;
};

inline ModelConfig small_llama(const LlamaSizes& s) {
  ModelConfig c;
  c.num_layers = s.layers;
  c.hidden_size = s.hidden;
  c.num_attention_heads = s.heads;
  c.num_query_groups = s.groups;
  c.kv_channels = s.hidden / s.heads;
  c.ffn_hidden_size = s.ffn;
  c.seq_length = c.max_position_embeddings = s.seq;
  c.vocab_size = c.padded_vocab_size = s.vocab;
  c.normalization = "RMSNorm";
  c.swiglu = true;
  c.add_bias_linear = false;
  c.position_embedding_type = "rope";
  c.untie_embeddings_and_output_weights = true;
  c.hidden_dropout = c.attention_dropout = 0.0;
  return c;
}

// One SwiGLU MoE layer for tests of the experts alone: `experts` experts of ffn `expert_ffn`,
// top-2 routing, a dense ffn of twice the hidden size for the shared parts.
inline ModelConfig one_moe_layer(int hidden, int experts, int expert_ffn) {
  ModelConfig c;
  c.hidden_size = hidden;
  c.ffn_hidden_size = 2 * hidden;
  c.num_layers = 1;
  c.swiglu = true;
  c.num_experts = experts;
  c.moe_ffn_hidden_size = expert_ffn;
  c.moe_router_topk = 2;
  c.moe_layers = {1};
  return c;
}

}  // namespace megatron::test
