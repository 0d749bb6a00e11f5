#include "model/gpt_model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <map>

#include "core/activation_offload.h"
#include "core/parallel.h"
#include "kernels/gemv_ops.h"
#include "kernels/ops.h"
#include "model/family.h"
#include "model/loss.h"
#include "moe/aux_loss.h"
#include "moe/moe_layer.h"
#include "tensor_parallel/cross_entropy.h"
#include "tensor_parallel/grad_accumulation.h"
#include "tensor_parallel/mappings.h"
#include "tensor_parallel/recompute.h"
#include "tensor_parallel/sharding.h"

namespace megatron {

GPTModel::GPTModel(const ModelConfig& c, const tp::TensorParallel& tp, std::optional<pipeline::ChunkLayers> chunk,
                   std::optional<LayerSpec> spec, at::Device device)
    : config_(c), tp_(tp), chunk_(chunk.value_or(pipeline::ChunkLayers{0, c.num_layers, true, true})) {
  TORCH_CHECK(c.padded_vocab_size % tp.size() == 0, "padded vocabulary does not split across tensor-parallel ranks");
  TORCH_CHECK(chunk_.num_layers >= 1, "a pipeline chunk needs at least one decoder layer");
  const LayerSpec layer_spec = spec ? *spec : family_of(c).layer_spec(c);
  const at::TensorOptions on = at::TensorOptions().device(device);
  const int64_t local_vocab = c.padded_vocab_size / tp.size();
  // Vocabulary rows split over TP (VocabParallelEmbedding, and the column-parallel output layer).
  tp::ParamInfo vocab;
  vocab.split = {0, false};
  vocab.vocab_rows = true;
  if (chunk_.pre_process || holds_embedding_copy()) {
    auto embedding = register_module("embedding", std::make_shared<tp::DescribedModule>());
    auto word = embedding->register_module("word_embeddings", std::make_shared<tp::DescribedModule>());
    tp::ParamInfo info = vocab;
    info.word_embedding = true;
    word_embeddings = word->add_parameter("weight", at::empty({local_vocab, c.hidden_size}, on), info);
    if (chunk_.pre_process && c.position_embedding_type == "learned_absolute") {
      auto pos = embedding->register_module("position_embeddings", std::make_shared<tp::DescribedModule>());
      position_embeddings = pos->add_parameter("weight", at::empty({c.max_position_embeddings, c.hidden_size}, on), tp::ParamInfo());
    }
  }
  auto decoder = register_module("decoder", std::make_shared<tp::DescribedModule>());
  auto layer_holder = decoder->register_module("layers", std::make_shared<tp::DescribedModule>());
  if (!c.fp8.empty()) fp8_ = std::make_shared<fp8::Fp8Context>(fp8::options_for(c));
  for (int i = chunk_.first_layer; i < chunk_.first_layer + chunk_.num_layers; ++i) {
    layers.push_back(layer_holder->register_module(
        std::to_string(i), std::make_shared<TransformerLayer>(c, tp, layer_spec, device, i, c.fp8_layer(i) ? fp8_ : nullptr, documents_)));
  }
  if (chunk_.post_process) {
    final_layernorm = decoder->register_module("final_layernorm", std::make_shared<NormModule>(c, tp, device));
    if (c.untie_embeddings_and_output_weights) {
      auto out = register_module("output_layer", std::make_shared<tp::DescribedModule>());
      output_layer_weight = out->add_parameter("weight", at::empty({local_vocab, c.hidden_size}, on), vocab);
    }
    if (c.mtp_num_layers > 0) mtp = register_module("mtp", std::make_shared<MultiTokenPrediction>(c, tp, layer_spec, device));
  }
  table_ = tp::describe_parameters(*this);
}

tp::ParamTable describe_model(const ModelConfig& config, std::optional<pipeline::ChunkLayers> chunk) {
  return GPTModel(config, tp::TensorParallel(), chunk, std::nullopt, at::kMeta).parameter_table();
}

void GPTModel::initialize(uint64_t seed) { initialize_chunks({this}, seed); }

namespace {

// Each parameter's own seed: FNV-1a of its name mixed into the run's seed (splitmix64), so
// streams of different parameters, and of nearby seeds, are unrelated.
uint64_t parameter_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (h | 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// --cpu-offloading applies to this forward: a training forward that builds a graph.
bool offloads_activations(const GPTModel& model) {
  return model.config().cpu_offloading && model.is_training() && at::GradMode::is_enabled();
}

}  // namespace

void initialize_chunks(const std::vector<GPTModel*>& chunks, uint64_t seed) {
  TORCH_CHECK(!chunks.empty(), "initialize_chunks: no chunks");
  const ModelConfig& config = chunks[0]->config();
  const tp::TensorParallel& tensor_parallel = chunks[0]->tensor_parallel();
  std::map<std::string, std::pair<at::Tensor, tp::ParamInfo>> held;  // a tied embedding's copies share the name
  for (GPTModel* chunk : chunks) {
    for (auto& item : chunk->named_parameters(/*recurse=*/true)) {
      held[item.key()] = {item.value(), chunk->parameter_table().at(item.key())};
    }
  }
  const std::vector<std::pair<std::string, std::pair<at::Tensor, tp::ParamInfo>>> params(held.begin(), held.end());
  const double std = config.init_method_std;
  const double output_std = std / std::sqrt(2.0 * config.num_layers);
  // Independent generators, so the parameters are drawn in parallel (one per thread at a time,
  // on plain threads: core/parallel.h) with the same result as one by one.
  parallel_items(static_cast<int64_t>(params.size()), at::get_num_threads(), [&](int64_t i) {
    at::NoGradGuard no_grad;
    const auto& [name, held_param] = params[i];
    const auto& [param, info] = held_param;
    const dist::Group& split = tensor_parallel.split_group(info);  // TP, or expert TP for experts
    const std::vector<int64_t> shape = tp::full_shape(param.sizes(), info.split, split.size());
    at::Tensor value;
    switch (info.init) {
      case tp::Init::Ones: value = at::ones(shape); break;
      case tp::Init::Zeros: value = at::zeros(shape); break;
      case tp::Init::Normal:
      case tp::Init::ScaledNormal: {
        // The stream is named by the parameter: the same draw under every layout.
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(parameter_seed(seed, name));
        value = at::empty(shape, at::kFloat).normal_(0.0, info.init == tp::Init::ScaledNormal ? output_std : std, gen);
        break;
      }
    }
    // Every TP rank draws the whole tensor and keeps its shard.
    at::Tensor(param).copy_(tp::shard_of(value, info.split, split.rank(), split.size()));
  });
}

const RopeTables* GPTModel::rope_for(int64_t seq_len, const at::Device& device) {
  if (config_.position_embedding_type != "rope") return nullptr;
  if (!rope_ || rope_->cos.size(0) < seq_len || rope_->cos.device() != device) {
    rope_ = make_rope_tables(config_, std::max<int64_t>(seq_len, config_.seq_length), device);
  }
  return &*rope_;
}

at::Tensor GPTModel::embed(const at::Tensor& tokens, const at::Tensor& position_ids) {
  const int64_t s = tokens.size(1);
  if (before_use) before_use({word_embeddings, position_embeddings});
  at::Tensor hidden = tp::vocab_parallel_embedding(word_embeddings, tokens.t(), tp_);  // [s, b, h]
  if (position_embeddings.defined()) {
    hidden = position_ids.defined()
                 ? hidden + at::embedding(position_embeddings, position_ids.t())                   // [s, b, h]
                 : hidden + at::embedding(position_embeddings, at::arange(s, tokens.options())).unsqueeze(1);
  }
  if (tp_.sequence_parallel) hidden = tp::scatter_to_sp(hidden, tp_.group);  // [s/tp, b, h]
  const bool sharded = tp_.sequence_parallel && is_training() && config_.hidden_dropout > 0.0;
  return tp_.random(sharded, [&] { return at::dropout(hidden, config_.hidden_dropout, is_training()); });
}

const RopeTables* GPTModel::tables_for(const at::Tensor& tokens, const at::Tensor& position_ids, std::optional<RopeTables>& gathered) {
  const RopeTables* tables = rope_for(tokens.size(1), tokens.device());
  if (tables != nullptr && position_ids.defined()) {  // per-sample positions: the tables' rows for them
    gathered = gather_rope_tables(*tables, position_ids);
    tables = &*gathered;
  }
  return tables;
}

at::Tensor GPTModel::hidden_states(const at::Tensor& tokens, const at::Tensor& position_ids, const at::Tensor& attention_mask,
                                   const at::Tensor& input) {
  at::Tensor hidden;
  if (chunk_.pre_process) {
    hidden = embed(tokens, position_ids);
  } else {
    TORCH_CHECK(input.defined(), "GPTModel::forward: a chunk without the embedding needs the previous stage's output");
    hidden = input;  // [s(/tp), b, h]
  }
  std::optional<RopeTables> gathered;
  const RopeTables* tables = tables_for(tokens, position_ids, gathered);
  const bool offloading = offloads_activations(*this);
  if (offloading) {
    if (!offloader_) offloader_ = std::make_shared<ActivationOffloader>(config_.cpu_offloading_num_layers, hidden.device(),
                                                                     config_.min_offloaded_tensor_size);
    if (rope_) {  // read by every layer: stays on the device
      offloader_->keep_on_device(rope_->cos);
      offloader_->keep_on_device(rope_->sin);
    }
  }
  ResidualStream stream{hidden, {}, {}};
  for (size_t first = 0; first < layers.size();) {
    const size_t count = recomputed_group_at(first);
    if (count == 0) {
      stream = run_layers(first, 1, stream, tables, attention_mask);
      ++first;
      continue;
    }
    // The group keeps only its input; its layers run again in the backward. The closure holds
    // copies of the tables and the mask: it runs after this forward has returned.
    std::optional<RopeTables> rope_copy;
    if (tables != nullptr) rope_copy = *tables;
    auto region = [this, first, count, rope_copy, attention_mask](const std::vector<at::Tensor>& in) {
      const ResidualStream out = run_layers(first, count, {in[0], in.size() > 1 ? in[1] : at::Tensor(), {}},
                                            rope_copy ? &*rope_copy : nullptr, attention_mask);
      return out.delta.defined() ? std::vector<at::Tensor>{out.base, out.delta} : std::vector<at::Tensor>{out.base};
    };
    std::vector<at::Tensor> in = {stream.base};
    if (stream.delta.defined()) in.push_back(stream.delta);
    const bool draws_random = is_training() && (config_.hidden_dropout > 0.0 || config_.attention_dropout > 0.0);
    const std::vector<at::Tensor> out = tp::recompute_in_backward(region, in, tp_, draws_random);
    stream = {out[0], out.size() > 1 ? out[1] : at::Tensor(), {}};
    first += count;
  }
  if (offloading) offloader_->finish_forward();
  if (!chunk_.post_process) return stream.materialize();  // [s(/tp), b, h]
  return final_normed(stream);
}

at::Tensor GPTModel::final_normed(const ResidualStream& stream) {
  const NormParams final_norm = final_layernorm->params();
  if (before_use) before_use({final_norm.weight, final_norm.bias});
  const at::Tensor gamma = final_norm.gamma();  // [h]
  if (stream.delta.defined() && gamma.scalar_type() == stream.base.scalar_type()) {
    // The last layer's residual add, fused with the final RMSNorm.
    return kernels::add_rms_norm(stream.base, stream.delta, gamma, final_norm.eps).normed;
  }
  if (stream.delta.defined()) return final_norm.apply(stream.materialize());
  return final_norm.apply(stream.base);  // [s(/tp), b, h]
}

at::Tensor GPTModel::output_logits(const at::Tensor& normed) {
  if (before_use) before_use({output_layer_weight, word_embeddings});
  const at::Tensor& out_weight = output_layer_weight.defined() ? output_layer_weight : word_embeddings;
  // The output layer is column-parallel over the vocabulary.
  const at::Tensor hidden = tp_.sequence_parallel ? tp::gather_from_sp(normed, tp_.group) : tp::copy_to_tp(normed, tp_.group);
  // Untied: the output weight's gradient may accumulate in the GEMM (its only use). Tied: the
  // embedding lookup adds to the same gradient, so it takes the ordinary path.
  if (output_layer_weight.defined()) return tp::linear(hidden, out_weight);  // [s, b, V/tp]
  return kernels::linear(hidden, out_weight, {});
}

at::Tensor GPTModel::forward(const at::Tensor& tokens, const at::Tensor& position_ids, const at::Tensor& attention_mask,
                            const at::Tensor& input) {
  const at::Tensor hidden = hidden_states(tokens, position_ids, attention_mask, input);
  return chunk_.post_process ? output_logits(hidden) : hidden;
}

at::Tensor GPTModel::forward_cached(const at::Tensor& tokens, KvCacheStep& step, bool last_position_only, const at::Tensor& input) {
  TORCH_CHECK(!is_training() && !tp_.sequence_parallel, "GPTModel::forward_cached: generation runs in eval mode, without sequence parallelism");
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == step.batch() && tokens.size(1) == step.new_tokens(),
              "GPTModel::forward_cached: tokens ", tokens.sizes(), " for a step of ", step.batch(), " x ", step.new_tokens());
  TORCH_CHECK(chunk_.pre_process || (input.dim() == 3 && input.size(0) == step.new_tokens() && input.size(1) == step.batch()),
              "GPTModel::forward_cached: a chunk without the embedding starts from the previous stage's [s, b, h], got ", input.sizes());
  const at::Tensor& positions = step.position_ids();  // [b, s]
  ResidualStream stream{chunk_.pre_process ? embed(tokens, positions) : input, {}, {}};  // [s, b, h]
  std::optional<RopeTables> gathered;
  // Tables for every position the cache holds, made once: a decode graph keeps their address, and
  // a graph attending to fewer keys than another must not have them made again under it.
  if (const RopeTables* tables = rope_for(step.capacity(), tokens.device())) gathered = gather_rope_tables(*tables, positions);
  // With the norms in the GEMVs each layer's last GEMV may prepare the norm after it (the next
  // layer's input norm, or the final norm) in its epilogue.
  const bool prepare_norms = step.decode_kernels().norms_in_gemv;
  for (size_t l = 0; l < layers.size(); ++l) {
    if (before_use) before_use(layers[l]->parameters());
    const LayerKvCache cache = step.layer(static_cast<int64_t>(l));  // the chunk's own layers: the cache holds those
    std::optional<NormParams> next;
    if (prepare_norms && l + 1 < layers.size()) next = layers[l + 1]->input_norm();
    if (prepare_norms && l + 1 == layers.size() && chunk_.post_process) next = final_layernorm->params();
    if (before_use && next) before_use({next->weight});
    stream = layers[l]->forward(stream, gathered ? &*gathered : nullptr, {}, &cache, next ? &*next : nullptr);
  }
  if (!chunk_.post_process) return stream.materialize();  // [s, b, h], for the next stage
  if (step.decode_kernels().norms_in_gemv) {
    if (std::optional<at::Tensor> logits = output_logits_after_norm(stream)) {
      step.decode_kernels_run().norms_in_gemv = true;
      return *logits;  // [1, 1, V/tp]
    }
  }
  at::Tensor normed = final_normed(stream);  // [s, b, h]
  if (last_position_only) normed = step.last_kept_rows(normed);  // [1, b, h]: each sequence's last token
  return output_logits(normed);  // [s or 1, b, V/tp]
}

std::optional<at::Tensor> GPTModel::output_logits_after_norm(const ResidualStream& stream) {
  const NormParams final_norm = final_layernorm->params();
  // The output layer's input is the row as it is without sequence parallelism (copy_to_tp).
  if (final_norm.kind != NormKind::RMSNorm || tp_.sequence_parallel) return std::nullopt;
  const at::Tensor& out_weight = output_layer_weight.defined() ? output_layer_weight : word_embeddings;
  if (stream.prepared && kernels::gemv_after_prepared_norm_takes(*stream.prepared, out_weight, {}, /*gated=*/false)) {
    // The last layer's fc2 did the final norm's first half.
    if (before_use) before_use({output_layer_weight, word_embeddings});
    return kernels::gemv_after_prepared_norm(*stream.prepared, out_weight, {}, /*gated=*/false);
  }
  const at::Tensor gamma = final_norm.gamma();  // [h]
  if (!kernels::gemv_after_norm_takes(stream.base, stream.delta, gamma, out_weight, {}, /*gated=*/false)) return std::nullopt;
  if (before_use) before_use({final_norm.weight, final_norm.bias, output_layer_weight, word_embeddings});
  return kernels::gemv_after_norm(stream.base, stream.delta, gamma, final_norm.eps, out_weight, {}, /*gated=*/false).y;
}

ResidualStream GPTModel::run_layers(size_t first, size_t count, ResidualStream stream, const RopeTables* tables,
                                    const at::Tensor& attention_mask) {
  const bool offloading = offloader_ && offloads_activations(*this);
  for (size_t l = first; l < first + count; ++l) {
    if (before_use) before_use(layers[l]->parameters());
    if (!offloading) {
      stream = layers[l]->forward(stream, tables, attention_mask);
      continue;
    }
    const int64_t global = chunk_.first_layer + int64_t(l);
    {
      ActivationOffloader::Scope scope = offloader_->scope(global);
      stream = layers[l]->forward(stream, tables, attention_mask);
    }
    // The layer's output as the next layer receives it: its gradient arrives when this layer's backward begins.
    offloader_->after_layer(global, stream.delta.defined() ? stream.delta : stream.base);
  }
  return stream;
}

size_t GPTModel::recomputed_group_at(size_t layer) const {
  if (config_.recompute_granularity != "full" || !is_training()) return 0;
  const size_t n = static_cast<size_t>(config_.recompute_num_layers);
  if (config_.recompute_method == "block") return layer < n ? 1 : 0;  // the chunk's first n layers, one by one
  return std::min(n, layers.size() - layer);                            // uniform: groups of n (the last may be short)
}

at::Tensor GPTModel::cross_entropy(const at::Tensor& logits, const at::Tensor& labels) const {
  const int64_t s = logits.size(0), b = logits.size(1), v = logits.size(2);
  if (config_.cross_entropy_loss_fusion) return tp::fused_vocab_parallel_cross_entropy(logits, labels.t(), tp_.group).t();
  if (tp_.size() > 1) return tp::vocab_parallel_cross_entropy(logits, labels.t(), tp_.group).t();  // [b, s]
  // Cross entropy in fp32, as Megatron does, whatever the activation dtype.
  at::Tensor losses = at::cross_entropy_loss(logits.to(at_least_fp32(logits.scalar_type())).view({s * b, v}),
                                             labels.t().reshape({s * b}), /*weight=*/{}, at::Reduction::None);
  return losses.view({s, b}).t();  // [b, s]
}

at::Tensor GPTModel::token_losses(const Batch& batch, const at::Tensor& input) {
  TORCH_CHECK(chunk_.post_process, "GPTModel::token_losses: this chunk does not end the model");
  const at::Tensor hidden = hidden_states(batch.tokens, batch.position_ids, batch.attention_mask, input);  // [s(/tp), b, h]
  at::Tensor logits = output_logits(hidden);  // [s, b, V/tp]
  if (mtp && is_training() && at::GradMode::is_enabled()) {
    // The depths' loss enters backward beside the main loss, with its scale (1 / micro-batches).
    std::optional<RopeTables> gathered;
    MtpModelParts parts;
    parts.embed = [&](const at::Tensor& tokens) { return embed(tokens, batch.position_ids); };
    parts.logits = [&](const at::Tensor& normed) { return output_logits(normed); };
    parts.token_losses = [&](const at::Tensor& l, const at::Tensor& labels) { return cross_entropy(l, labels); };
    parts.rope = tables_for(batch.tokens, batch.position_ids, gathered);
    parts.attention_mask = batch.attention_mask;
    logits = moe::attach_loss(logits, mtp->loss(hidden, batch, parts), auxiliary_loss_scale_, fp16_loss_scale_);
  }
  return cross_entropy(logits, batch.labels);  // [b, s]
}

at::Tensor GPTModel::loss(const Batch& batch, const at::Tensor& input) {
  return masked_token_mean(token_losses(batch, input), batch).loss;
}

void GPTModel::pack_experts() {
  for (moe::MoELayer* moe : moe_layers()) moe->experts->pack_weights();
}

std::vector<moe::MoELayer*> GPTModel::moe_layers() const {
  std::vector<TransformerLayer*> all;
  for (const auto& layer : layers) all.push_back(layer.get());
  if (mtp) {
    for (const auto& depth : mtp->layers) all.push_back(depth->transformer_layer.get());
  }
  std::vector<moe::MoELayer*> out;
  for (TransformerLayer* layer : all) {
    if (auto* moe = dynamic_cast<moe::MoELayer*>(layer->mlp.get())) out.push_back(moe);
  }
  return out;
}

void GPTModel::set_moe_loss_scale(double scale, const at::Tensor& fp16_loss_scale) {
  auxiliary_loss_scale_ = scale;
  fp16_loss_scale_ = fp16_loss_scale;
  for (moe::MoELayer* moe : moe_layers()) moe->router->set_loss_scale(scale, fp16_loss_scale);
  if (mtp) mtp->set_tracked_scale(scale);
}

at::Tensor GPTModel::take_moe_losses() {
  at::Tensor sum;
  for (moe::MoELayer* moe : moe_layers()) {
    const at::Tensor tracked = moe->router->take_tracked();
    if (tracked.defined()) sum = sum.defined() ? sum + tracked : tracked;
  }
  return sum;
}

at::Tensor GPTModel::take_mtp_losses() { return mtp ? mtp->take_tracked() : at::Tensor(); }

void GPTModel::update_expert_biases() {
  std::vector<moe::TopKRouter*> routers;
  for (moe::MoELayer* moe : moe_layers()) {
    if (moe->router->expert_bias.defined()) routers.push_back(moe->router.get());
  }
  if (routers.empty()) return;
  std::vector<at::Tensor> counts;
  for (moe::TopKRouter* r : routers) counts.push_back(r->take_expert_counts());
  at::Tensor all = at::stack(counts);  // [layers, E]: this rank's tokens per expert this step
  if (tp_.size() > 1) tp_.group.all_reduce(all);
  if (tp_.data.size() > 1) tp_.data.all_reduce(all);
  for (size_t i = 0; i < routers.size(); ++i) routers[i]->update_expert_bias(all[int64_t(i)]);
}

void GPTModel::finish_fp8_step() {
  if (!fp8_) return;
  // Megatron's amax reduction group: TP x DP (x CP), or TP alone with --tp-only-amax-red.
  fp8_->delayed().update([&](at::Tensor& amaxes) {
    if (tp_.size() > 1) tp_.group.all_reduce(amaxes, dist::ReduceOp::Max);
    if (!config_.tp_only_amax_red && tp_.data.size() > 1) tp_.data.all_reduce(amaxes, dist::ReduceOp::Max);
  });
  fp8_->next_step();
}

std::map<std::string, tp::Fp8Linear*> GPTModel::fp8_linears() const {
  std::map<std::string, tp::Fp8Linear*> found;
  for (const auto& m : named_modules("", /*include_self=*/false)) {
    tp::Fp8Linear* fp8 = nullptr;
    if (auto* column = dynamic_cast<tp::ColumnParallelLinear*>(m.value().get())) fp8 = column->fp8.get();
    if (auto* row = dynamic_cast<tp::RowParallelLinear*>(m.value().get())) fp8 = row->fp8.get();
    if (fp8 != nullptr) found[m.key()] = fp8;
  }
  return found;
}

void GPTModel::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  at::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    if (table_.at(p.key()).keep_fp32) p.value().set_data(p.value().to(at::kFloat));
  }
}

int64_t GPTModel::count_parameters(bool experts_only) const {
  int64_t n = 0;
  for (const auto& p : named_parameters()) {
    const tp::ParamInfo& info = table_.at(p.key());
    if (!info.trainable) continue;  // model state, not a parameter in Megatron's count
    if ((holds_embedding_copy() && info.word_embedding) || (experts_only && info.expert < 0)) continue;
    n += info.split.replicated() ? p.value().numel() : p.value().numel() * tp_.split_group(info).size();
  }
  return n;
}

}  // namespace megatron
