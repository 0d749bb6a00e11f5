// The GPT model of Megatron-Core: vocab embedding -> decoder layers -> final norm -> output
// layer, activations [s, b, h]. Parameter names match Megatron-Core's
// (`embedding.word_embeddings.weight`, `decoder.layers.0.self_attention.linear_qkv.weight`, ...).
//
// One object is one pipeline chunk: a contiguous range of decoder layers (named by their global
// index), plus the embedding on the chunk that begins the model (pre-process) and the final
// norm and output layer on the chunk that ends it (post-process). The whole model is the
// single chunk. With tied embeddings and a pipeline, the post-process chunk holds its own copy
// of `embedding.word_embeddings.weight` for the output layer; the two copies start equal and
// their gradients are summed across the stages, so they stay equal.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "core/config.h"
#include "data/micro_batch.h"
#include "model/kv_cache.h"
#include "model/layer_spec.h"
#include "model/mtp.h"
#include "model/norm_module.h"
#include "model/rope.h"
#include "model/transformer_layer.h"
#include "pipeline/layout.h"
#include "tensor_parallel/layers.h"
#include "tensor_parallel/parameters.h"

namespace megatron {

namespace moe {
class MoELayer;
}
class ActivationOffloader;

class GPTModel : public tp::DescribedModule {
 public:
  // With tensor parallelism (tp.size() > 1) this process holds its TP rank's shard; `chunk`
  // (default: the whole model) selects the layers and ends this object holds; `spec` (default:
  // the family's, model/family.h) the parts of each decoder layer. On `device` kMeta the parameters are
  // described but not allocated (describe_model).
  explicit GPTModel(const ModelConfig& config, const tp::TensorParallel& tp = {},
                    std::optional<pipeline::ChunkLayers> chunk = std::nullopt, std::optional<LayerSpec> spec = std::nullopt,
                    at::Device device = at::kCPU);

  // Megatron's initialisation: normal(0, std) for weights, std / sqrt(2 * num_layers) for the
  // projections into the residual stream, ones / zeros for norms and biases, drawn on CPU in
  // fp32 (see initialize_chunks).
  void initialize(uint64_t seed);

  // tokens [b, s] -> logits [s, b, V/tp] (this rank's vocabulary slice) in the parameters' dtype.
  // position_ids [b, s] and attention_mask ([b, 1, s, s], true = attend, or [b, s] document ids)
  // are optional, as in Batch. A chunk without pre-process starts from `input` [s(/tp with SP), b, h], the previous
  // stage's output; one without post-process returns its hidden states in that shape.
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& position_ids = {},
                     const at::Tensor& attention_mask = {}, const at::Tensor& input = {});

  // Generation: tokens [b, s], the next s tokens of the step's b sequences, attending over what
  // the cache holds of them (the cache's layers are this chunk's) -> logits [s, b, V/tp] (with
  // last_position_only [1, b, V/tp]: each sequence's last token the step keeps). The caller
  // commits the step. Eval mode, no sequence parallelism. A pipeline chunk without pre-process
  // starts from `input` [s, b, h], the previous stage's output; one without post-process returns
  // its hidden states [s, b, h].
  at::Tensor forward_cached(const at::Tensor& tokens, KvCacheStep& step, bool last_position_only = true, const at::Tensor& input = {});

  // Per-token cross entropy (fp32), [b, s]. Post-process chunk only.
  at::Tensor token_losses(const Batch& batch, const at::Tensor& input = {});

  // Mean loss over the tokens the mask selects (masked_token_mean). Post-process chunk only.
  at::Tensor loss(const Batch& batch, const at::Tensor& input = {});

  // Parameters of this chunk counted over all TP shards (a tied output copy is not counted:
  // the pre-process chunk counts that weight).
  int64_t num_parameters() const { return count_parameters(false); }
  // Of those, the MoE experts' this rank holds (its expert-parallel share).
  int64_t num_expert_parameters() const { return count_parameters(true); }
  const ModelConfig& config() const { return config_; }
  const tp::TensorParallel& tensor_parallel() const { return tp_; }
  const pipeline::ChunkLayers& chunk() const { return chunk_; }
  // What each parameter of this chunk is (TP split, init rule, ...), by its global name in
  // registration order.
  const tp::ParamTable& parameter_table() const { return table_; }
  // The MoE layers' router losses (moe/aux_loss.h): the gradient they enter backward with (the
  // main loss's 1 / micro-batches, times `fp16_loss_scale` under --fp16: [] fp32 on the device),
  // and what they tracked since the last call, summed over this chunk's MoE layers ([n] fp32 in
  // moe::tracked_loss_names order; undefined without any).
  void set_moe_loss_scale(double scale, const at::Tensor& fp16_loss_scale = {});
  at::Tensor take_moe_losses();
  // Generation, after the model's last move: every MoE layer's experts packed for the grouped GEMM
  // (moe::GroupedExperts::pack_weights).
  void pack_experts();
  // The multi-token prediction depths' mean losses since the last call, each times that scale
  // ([D] fp32; undefined without MTP on this chunk).
  at::Tensor take_mtp_losses();
  // The routers' expert biases (--moe-router-enable-expert-bias) moved by the step's expert
  // counts, summed over TP and DP (one all-reduce of every layer's counts each); after the
  // step's last backward, before the optimizer. Collective over this stage's TP and DP ranks.
  void update_expert_biases();

  // FP8 (--fp8-format): after the step's last backward, the delayed recipe's scales move (its
  // amaxes all-reduced over TP x DP: collective over them) and the layers will cast their weights
  // again. Nothing without FP8.
  void finish_fp8_step();
  // The context of this chunk's FP8 layers (null without FP8), and those layers by module name
  // (`decoder.layers.3.self_attention.linear_qkv`).
  const std::shared_ptr<fp8::Fp8Context>& fp8_context() const { return fp8_; }
  std::map<std::string, tp::Fp8Linear*> fp8_linears() const;

  // --cpu-offloading: what moved the activations of the last training forward (null before the
  // first, and without the flag).
  const ActivationOffloader* activation_offloader() const { return offloader_.get(); }

  // As torch::nn::Module's, but parameters described keep_fp32 stay fp32.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  using torch::nn::Module::to;
  // This chunk ends the model but does not begin it, and holds a copy of the word embedding: for
  // a tied output layer, or for multi-token prediction's embeddings. The copies start equal and
  // their gradients are summed across the first and last stage, so they stay equal.
  bool holds_embedding_copy() const {
    return chunk_.post_process && !chunk_.pre_process && config_.output_uses_word_embeddings();
  }

  at::Tensor word_embeddings;       // [V/tp, h] (pre-process, or the tied output copy)
  at::Tensor position_embeddings;   // [max_pos, h] (learned_absolute, pre-process only)
  std::vector<std::shared_ptr<TransformerLayer>> layers;  // registered as decoder.layers.<global index>
  std::shared_ptr<NormModule> final_layernorm;  // weight [h] (bias [h] for LayerNorm); post-process
  at::Tensor output_layer_weight;     // [V/tp, h] when untied
  std::shared_ptr<MultiTokenPrediction> mtp;  // --mtp-num-layers, post-process

  // Called in forward with the parameters the next part (embedding, a layer, the head) is
  // about to use, so an overlapped parameter all-gather need only have finished for those.
  std::function<void(const std::vector<at::Tensor>&)> before_use;

 private:
  int64_t count_parameters(bool experts_only) const;
  const RopeTables* rope_for(int64_t seq_len, const at::Device& device);
  // The tables for tokens [b, s] at position_ids (optional; their rows gathered into `gathered`).
  const RopeTables* tables_for(const at::Tensor& tokens, const at::Tensor& position_ids, std::optional<RopeTables>& gathered);
  at::Tensor embed(const at::Tensor& tokens, const at::Tensor& position_ids);  // [b, s] -> [s(/tp), b, h]
  // The decoder's output: [s(/tp), b, h], final-normed on the chunk that ends the model.
  at::Tensor hidden_states(const at::Tensor& tokens, const at::Tensor& position_ids, const at::Tensor& attention_mask,
                           const at::Tensor& input);
  at::Tensor final_normed(const ResidualStream& stream);  // the decoder's output, final norm applied
  at::Tensor output_logits(const at::Tensor& normed);                                   // -> [s, b, V/tp]
  // A batch-1 decode step's logits [1, 1, V/tp] with the final RMSNorm in the output GEMV
  // (DecodeKernels::norms_in_gemv); nullopt, with nothing run, where the GEMV cannot.
  std::optional<at::Tensor> output_logits_after_norm(const ResidualStream& stream);
  at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& labels) const;  // labels [b, s] -> [b, s] fp32
  std::vector<moe::MoELayer*> moe_layers() const;  // of the decoder and of the MTP depths
  // Layers [first, first + count) of this chunk on the residual stream.
  ResidualStream run_layers(size_t first, size_t count, ResidualStream stream, const RopeTables* tables,
                            const at::Tensor& attention_mask);
  // How many layers from `layer` on form one recomputed group (--recompute-granularity full);
  // 0: layer `layer` keeps its activations.
  size_t recomputed_group_at(size_t layer) const;

  ModelConfig config_;
  tp::TensorParallel tp_;
  pipeline::ChunkLayers chunk_;
  std::optional<RopeTables> rope_;
  tp::ParamTable table_;
  std::shared_ptr<fp8::Fp8Context> fp8_;  // --fp8-format
  // Packed documents read off a micro-batch's mask once for every layer (model/document_attention.h).
  std::shared_ptr<DocumentsMemo> documents_ = std::make_shared<DocumentsMemo>();
  std::shared_ptr<ActivationOffloader> offloader_;  // --cpu-offloading, made at the first training forward
  double auxiliary_loss_scale_ = 1.0;  // what the MTP loss enters backward with (1 / micro-batches)
  at::Tensor fp16_loss_scale_;         // ... times this, under --fp16
};

// The parameter table of `chunk` (default: the whole model) of `config` with its family's layer
// spec, built on the meta device: no weights are allocated (`megatron convert`, HF export).
tp::ParamTable describe_model(const ModelConfig& config, std::optional<pipeline::ChunkLayers> chunk = std::nullopt);

// Megatron's initialisation for the chunks of one rank. Each parameter's full tensor is drawn
// in fp32 on the CPU from a generator of its own, seeded from `seed` and the parameter's name,
// and each TP rank keeps its shard: every TP x PP layout starts from the weights a single
// process would (as Megatron's --use-cpu-initialization), a rank draws only the parameters it
// holds, and the parameters are drawn in parallel over the CPU threads.
void initialize_chunks(const std::vector<GPTModel*>& chunks, uint64_t seed);

}  // namespace megatron
