#include "plan/step_estimate.h"

#include <algorithm>

#include "core/errors.h"

namespace megatron::plan {

Gpu gpu_named(const std::string& name) {
  // Memory as nvidia-smi reports it; peaks are NVIDIA's dense bf16 figures; NVLink one direction.
  static const Gpu known[] = {
      {"h100", 79.6, 989, 450},
      {"h200", 139.8, 989, 450},
      {"a100", 79.2, 312, 300},
      {"b200", 178.4, 2250, 900},
  };
  std::string names;
  for (const Gpu& g : known) {
    if (g.name == name) return g;
    names += (names.empty() ? "" : ", ") + g.name;
  }
  throw UserError("--gpu " + name + " is not one the planner knows (" + names +
                  "); for another card give --gpu-memory-gib, --gpu-peak-tflops and --nvlink-gb-per-s");
}

namespace {

// The bandwidth of a group whose ranks span `span` consecutive ranks: inside one node NVLink,
// else the network (ranks are laid out node by node, tp fastest: Megatron's order tp-cp-ep-dp-pp).
double link_bytes_per_second(const Cluster& c, int64_t span) {
  return 1e9 * (span <= c.gpus_per_node ? c.gpu.nvlink_gb_per_s : c.network_gb_per_s);
}

// Seconds a ring collective (all-gather or reduce-scatter) of `bytes` over `n` ranks takes.
double ring_seconds(double bytes, int64_t n, double bytes_per_second) {
  return n <= 1 ? 0.0 : bytes * double(n - 1) / double(n) / bytes_per_second;
}

}  // namespace

StepEstimate estimate_step(const Config& c, const Cluster& cluster, double flops_per_token,
                           const ParameterCensus::RankCount& parameters) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const TrainConfig& t = c.train;
  const int64_t tp = p.tensor_model_parallel_size, pp = p.pipeline_model_parallel_size, cp = p.context_parallel_size;
  const int64_t dp = p.data_parallel_size, ep = p.expert_model_parallel_size;
  const int64_t etp = p.expert_tensor_parallel_size > 0 ? p.expert_tensor_parallel_size : tp;
  const int64_t world = tp * pp * cp * dp, chunks = p.num_virtual_stages_per_pipeline_rank;
  const int64_t micro_batches = std::max<int64_t>(1, t.global_batch_size / (int64_t(t.micro_batch_size) * dp));
  const StateBytes state = state_bytes(c);
  const double act = state.activation;
  const double sequence_tokens = double(t.micro_batch_size) * m.seq_length;  // a micro-batch's tokens
  const double tokens = sequence_tokens / double(cp);                          // ... on this rank's layers
  const double layers = double(m.num_layers) / double(pp);                      // this stage's, all chunks
  StepEstimate s;

  // Compute: each GPU does 1 / (TP x PP x CP) of a micro-batch's FLOPs. Full recomputation runs the
  // recomputed layers' forward again: a third more.
  double recompute = 1.0;
  if (m.recompute_granularity == "full") {
    const double covered = m.recompute_method == "block" ? std::min(1.0, m.recompute_num_layers * double(chunks) / layers) : 1.0;
    recompute += covered / 3.0;
  }
  const double flops_rate = cluster.gpu.peak_tflops * 1e12 * cluster.mfu;
  // Causal attention's FLOPs a micro-batch on this rank: forward 2 GEMMs over half the (s x s)
  // scores, the backward 2.5 times that.
  const double heads = double(m.num_attention_heads) / double(tp);
  const double head_dim = m.multi_latent_attention ? m.qk_head_dim + m.qk_pos_emb_head_dim : m.kv_channels;
  const double attention_flops = 3.5 * 2 * 2 * tokens * (m.seq_length / 2.0) * heads * head_dim * layers;
  // Context parallelism splits the attention into blocks of S / 2CP tokens, each with its fixed
  // costs: the ring measured 1.07x one fused call at 2k-token chunks, 1.02-1.04x at 4k, 0.98-1.01x
  // from 8k (bench/context_attention_bench.cpp on an H100, docs/performance.md), which
  // 0.07 x 2048 / chunk follows; shorter chunks are extrapolated.
  const double chunk_tokens = double(m.seq_length) / double(2 * cp);
  const double ring_overhead = cp > 1 ? 0.07 * 2048.0 / chunk_tokens * attention_flops : 0.0;
  const double micro_batch_seconds =
      (sequence_tokens * flops_per_token * recompute / double(tp * pp * cp) + ring_overhead) / flops_rate;
  s.compute = double(micro_batches) * micro_batch_seconds;
  s.bubble = double(pp - 1) / double(chunks) * micro_batch_seconds;

  // TP: per layer and micro-batch, forward and backward, eight all-gathers / reduce-scatters of the
  // layer's [s, b, h] activations (with SP; without it four all-reduces, the same bytes).
  const double layer_tensor = tokens * m.hidden_size * act;
  if (tp > 1) {
    s.tensor_parallel = double(micro_batches) * layers * 8 * ring_seconds(layer_tensor, tp, link_bytes_per_second(cluster, tp));
  }
  // CP: the keys and values of this rank's tokens go to every other CP rank in the forward, and
  // again with their gradients (fp32) in the backward. The ring (p2p) overlaps that with the
  // blocks' attention; all_gather and a2a do not.
  if (cp > 1) {
    const double kv_channels = m.multi_latent_attention
                                   ? double(m.num_attention_heads) * (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim)
                                   : 2.0 * m.num_query_groups * m.kv_channels;
    const double kv = tokens * kv_channels / double(tp);
    const double bytes = double(cp - 1) * kv * (act + act + 4);
    double comm = bytes / link_bytes_per_second(cluster, tp * cp);
    if (m.cp_comm_type_of(0) == "p2p") comm = std::max(0.0, comm - attention_flops / layers / flops_rate);
    s.context_parallel = double(micro_batches) * layers * comm;
  }
  // EP: every MoE layer sends each routed copy of a token to its expert's rank and back, forward
  // and backward: four all-to-alls, each sending (EP - 1) / EP of the copies away.
  if (ep > 1 && m.num_experts > 0) {
    const double moe_layers = double(m.num_moe_layers()) / double(pp);
    const double routed = tokens / double(p.sequence_parallel ? tp : 1) * m.moe_router_topk * m.hidden_size * act;
    s.expert_parallel = double(micro_batches) * moe_layers * 4 * ring_seconds(routed, ep, link_bytes_per_second(cluster, etp * ep));
  }
  // PP: each micro-batch's activations cross every chunk boundary, forward and backward.
  if (pp > 1) {
    const double boundary = tokens * m.hidden_size * act / double(p.sequence_parallel ? tp : 1);
    s.pipeline = double(micro_batches) * double(chunks) * 2 * boundary / link_bytes_per_second(cluster, world);
  }
  // DP: the distributed optimizer reduce-scatters the gradients and all-gathers the updated
  // parameters over DP x CP (the experts' over the expert-data-parallel ranks). With
  // --overlap-grad-reduce and --overlap-param-gather the backward and the next forward hide what
  // fits under them; what is left shows.
  {
    const int64_t dense_ranks = dp * cp, expert_ranks = world / (pp * ep * etp);
    const double seconds = ring_seconds(double(parameters.dense) * (state.grad + state.weight), dense_ranks, link_bytes_per_second(cluster, tp * cp * dp)) +
                           ring_seconds(double(parameters.expert) * (state.grad + state.weight), expert_ranks, link_bytes_per_second(cluster, world / pp));
    const bool overlapped = p.overlap_grad_reduce && p.overlap_param_gather;
    s.data_parallel = overlapped ? std::max(0.0, seconds - s.compute) : seconds;
  }
  const double global_tokens = double(t.global_batch_size) * m.seq_length;
  s.tokens_per_second_per_gpu = global_tokens / s.total() / double(world);
  s.mfu = s.tokens_per_second_per_gpu * flops_per_token / (cluster.gpu.peak_tflops * 1e12);
  return s;
}

}  // namespace megatron::plan
