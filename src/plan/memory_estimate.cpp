#include "plan/memory_estimate.h"

#include <algorithm>

#include "model/gpt_model.h"
#include "optim/adamw.h"
#include "pipeline/layout.h"
#include "pipeline/schedules.h"

namespace megatron::plan {

ParameterCensus::ParameterCensus(const ModelConfig& finalized) : num_experts_(finalized.num_experts) {
  const GPTModel model(finalized, tp::TensorParallel(), std::nullopt, std::nullopt, at::kMeta);
  const tp::ParamTable& table = model.parameter_table();
  const std::string layers = "decoder.layers.";
  for (const auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& p = item.value();
    const tp::ParamInfo& info = table.at(name);
    // A decoder layer's parameters go to one part, named as the layer ("decoder.layers.7"); every
    // other parameter is a part of its own.
    const size_t layer_end = name.rfind(layers, 0) == 0 ? name.find('.', layers.size()) : std::string::npos;
    const std::string part = layer_end == std::string::npos ? name : name.substr(0, layer_end);
    PartSums& sums = parts_[part];
    const int64_t n = p.numel();
    total_ += n;
    if (info.expert >= 0) {
      experts_ += n;
      (info.split.replicated() ? sums.expert_replicated : sums.expert_split) += n;
    } else if (info.vocab_rows) {
      TORCH_CHECK(!info.split.replicated(), "plan: vocabulary parameter ", name, " is not split over TP");
      sums.vocab_split_columns += n / p.size(0);
    } else {
      (info.split.replicated() ? sums.replicated : sums.split) += n;
    }
  }
}

int64_t ParameterCensus::active_per_token(const ModelConfig& m) const {
  if (num_experts_ == 0) return total_;
  return total_ - experts_ + experts_ * m.moe_router_topk / num_experts_;
}

ParameterCensus::RankCount ParameterCensus::on_rank(const Config& layout, int pp_rank) const {
  const ModelConfig& m = layout.model;
  const ParallelConfig& p = layout.parallel;
  const int64_t tp = p.tensor_model_parallel_size;
  const int64_t etp = p.expert_tensor_parallel_size > 0 ? p.expert_tensor_parallel_size : tp;
  const int64_t ep = std::max(1, p.expert_model_parallel_size);
  RankCount count;
  for (const auto& [part, s] : parts_) {
    if (!pipeline::stage_holds(part, p, m, pp_rank)) continue;
    // The vocabulary is padded to a multiple of 128 x TP: a layout's rows differ from the census's.
    count.dense += s.replicated + s.split / tp + s.vocab_split_columns * m.padded_vocab_size / tp;
    // Every expert-parallel rank holds as many of each layer's experts.
    count.expert += (s.expert_replicated + s.expert_split / etp) / ep;
  }
  return count;
}

namespace {

// Whether --recompute-granularity full recomputes `layer` (its index within its model chunk).
bool fully_recomputed(const ModelConfig& m, int index_in_chunk) {
  if (m.recompute_granularity != "full") return false;
  return m.recompute_method != "block" || index_in_chunk < m.recompute_num_layers;
}

}  // namespace

StateBytes state_bytes(const Config& c) {
  const TrainConfig& t = c.train;
  const bool half = t.bf16 || t.fp16;
  auto size_of = [](const std::string& dtype) { return dtype == "fp32" ? 4.0 : 2.0; };
  StateBytes b{};
  b.activation = half ? 2 : 4;
  b.weight = half ? 2 : 4;
  b.grad = half && (c.parallel.grad_reduce_in_bf16 || t.main_grads_dtype == "bf16") ? 2 : 4;
  if (!half) {
    b.master = 0;  // fp32 training steps the parameters themselves
  } else if (t.use_precision_aware_optimizer) {
    // bf16 weights' fp32 masters as 16-bit remainders (Megatron's store_param_remainders).
    b.master = t.bf16 && stores_param_remainders(t) ? 2 : size_of(t.main_params_dtype);
  } else {
    b.master = 4;
  }
  b.moments = t.use_precision_aware_optimizer ? size_of(t.exp_avg_dtype) + size_of(t.exp_avg_sq_dtype) : 8;
  return b;
}

int64_t chunks_in_flight(int pp, int stage, int chunks, int64_t micro_batches) {
  // The schedule's warm-up, then one forward more before the first backward.
  return std::min<int64_t>(pipeline::warmup_forwards(pp, stage, chunks, micro_batches) + 1, micro_batches * chunks);
}

double layer_activation_bytes(const Config& c, int layer) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const double tp = p.tensor_model_parallel_size;
  // This rank's tokens of a micro-batch: CP splits the sequence; SP splits the tensors outside
  // the TP region ([s/tp, b, h]) further.
  const double tokens = double(c.train.micro_batch_size) * m.seq_length / p.context_parallel_size;
  const double sp = p.sequence_parallel ? tp : 1;
  const double act = state_bytes(c).activation;
  const double h = m.hidden_size;
  const bool swiglu = m.swiglu;
  auto recomputes = [&](const char* module) { return m.selectively_recomputes(module); };

  double per_token = 0;
  // Each of the two norms keeps its input (the residual stream) and fp32 1/rms; its output (the
  // next GEMM's input) too unless --recompute-modules layernorm.
  const double norm = h / sp * act + 4 / sp + (recomputes("layernorm") ? 0 : h / sp * act);
  per_token += 2 * norm;
  if (m.multi_latent_attention) {
    const double heads = m.num_attention_heads / tp, qk = m.qk_head_dim + m.qk_pos_emb_head_dim;
    // The compressed query and key/value (and their norms' outputs), replicated over TP.
    per_token += 2 * (m.q_lora_rank + m.kv_lora_rank + m.qk_pos_emb_head_dim) * act;
    // q, k, v of this rank's heads (recomputed from the compressed ones with mla_up_proj), the
    // attention output (the projection's input) and fp32 log-sum-exp.
    if (!recomputes("mla_up_proj")) per_token += heads * (2 * qk + m.v_head_dim) * act;
    per_token += heads * (m.v_head_dim * act + 4);
  } else {
    const double d = m.kv_channels, heads = m.num_attention_heads / tp, groups = m.num_query_groups / tp;
    // q, k, v after RoPE, the attention output (the projection's input), fp32 log-sum-exp.
    per_token += (2 * heads * d + 2 * groups * d) * act + heads * 4;
  }
  // In fp32 no flash kernel runs: the attention keeps its probabilities, [b, heads, s, s] (fp32).
  if (act == 4) per_token += m.num_attention_heads / tp * double(m.seq_length) * 4;
  if (m.hidden_dropout > 0) per_token += 2 * h / sp;  // the two residual dropouts' masks (a byte each)
  if (m.is_moe_layer(layer)) {
    const double etp = p.expert_tensor_parallel_size > 0 ? p.expert_tensor_parallel_size : tp;
    const double f = m.expert_ffn_hidden_size() / etp, k = m.moe_router_topk;
    per_token += m.num_experts * 4.0 / sp;  // the router's fp32 scores
    // Each routed copy of a token: the experts' input, fc1's output and the activation's (the
    // input of fc2), and the expert's output that the combine weights.
    if (!recomputes("moe")) per_token += k * (2 * h + ((swiglu ? 2 : 1) * f + (recomputes("moe_act") ? 0 : f))) * act;
    if (m.moe_shared_expert_intermediate_size > 0 && !recomputes("shared_experts")) {
      const double fs = m.moe_shared_expert_intermediate_size / tp;
      per_token += ((swiglu ? 2 : 1) * fs + fs) * act;
    }
  } else if (!recomputes("mlp")) {
    const double f = m.ffn_hidden_size / tp;
    per_token += ((swiglu ? 2 : 1) * f + f) * act;  // fc1's output and the activation's (fc2's input)
  }
  return tokens * per_token;
}

MemoryEstimate estimate_memory(const ParameterCensus& census, const Config& c) {
  const ModelConfig& m = c.model;
  const ParallelConfig& p = c.parallel;
  const TrainConfig& t = c.train;
  const int pp = p.pipeline_model_parallel_size, chunks = p.num_virtual_stages_per_pipeline_rank;
  const int64_t dp = p.data_parallel_size;
  const int64_t micro_batches = std::max<int64_t>(1, t.global_batch_size / (int64_t(t.micro_batch_size) * dp));
  const StateBytes b = state_bytes(c);
  const double act = b.activation;
  const double tp = p.tensor_model_parallel_size, sp = p.sequence_parallel ? tp : 1;
  const double tokens = double(t.micro_batch_size) * m.seq_length / p.context_parallel_size;
  // The distributed optimizer shards dense state over DP x CP, expert state over the ranks that
  // hold the same experts (world / (PP x EP x ETP)).
  const int64_t world = int64_t(p.tensor_model_parallel_size) * pp * p.context_parallel_size * dp;
  const int64_t etp = p.expert_tensor_parallel_size > 0 ? p.expert_tensor_parallel_size : p.tensor_model_parallel_size;
  const double dense_shards = p.use_distributed_optimizer ? double(dp) * p.context_parallel_size : 1;
  const double expert_shards = p.use_distributed_optimizer ? double(world) / (double(pp) * p.expert_model_parallel_size * etp) : 1;
  const double on_device = t.optimizer_cpu_offload ? 1.0 - t.optimizer_offload_fraction : 1.0;

  MemoryEstimate best;
  for (int stage = 0; stage < pp; ++stage) {
    MemoryEstimate e;
    e.stage = stage;
    e.parameters = census.on_rank(c, stage);
    const double params = double(e.parameters.dense + e.parameters.expert);
    e.weights = params * b.weight;
    e.gradients = params * b.grad;
    e.optimizer = on_device * (b.master + b.moments) * (e.parameters.dense / dense_shards + e.parameters.expert / expert_shards);
    const double in_flight_chunks = chunks_in_flight(pp, stage, chunks, micro_batches);
    double stage_layers = 0, recompute_group = 0;  // one micro-batch through every chunk of the stage
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const pipeline::ChunkLayers layers = pipeline::chunk_layers(p, m.num_layers, stage, chunk);
      for (int i = 0; i < layers.num_layers; ++i) {
        const int layer = layers.first_layer + i;
        if (layer < m.cpu_offloading_num_layers) continue;  // kept in host memory (--cpu-offloading-num-layers)
        if (fully_recomputed(m, i)) {
          stage_layers += tokens * m.hidden_size / sp * act;  // only the layer's input stays
          recompute_group = std::max(recompute_group, layer_activation_bytes(c, layer) *
                                                          (m.recompute_method == "block" ? 1 : std::max(1, m.recompute_num_layers)));
        } else {
          stage_layers += layer_activation_bytes(c, layer);
        }
      }
    }
    // A recomputed group's activations live again while its backward runs.
    e.activations = stage_layers / chunks * in_flight_chunks + recompute_group;
    if (stage == pp - 1) {
      // The logits [s, b, V/tp] and their gradient, both in the training dtype with the fused
      // cross entropy (an fp32 gradient without it); each multi-token prediction depth a layer and
      // logits more.
      const double logits = tokens * m.padded_vocab_size / tp * (act + (m.cross_entropy_loss_fusion ? act : 4));
      e.logits = logits * (1 + m.mtp_num_layers);
      if (m.mtp_num_layers > 0) e.activations += m.mtp_num_layers * layer_activation_bytes(c, m.num_layers - 1);
    }
    // Outside what the allocator counts as allocated: the CUDA context and NCCL's buffers
    // (kOutsideAllocator, an allowance) and the slack of its cached blocks over what is live (5%).
    e.overhead = kOutsideAllocator + 0.05 * e.allocated();
    if (stage == 0 || e.total() > best.total()) best = e;
  }
  return best;
}

}  // namespace megatron::plan
