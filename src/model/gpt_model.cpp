#include "model/gpt_model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "tensor_parallel/cross_entropy.h"
#include "tensor_parallel/mappings.h"
#include "tensor_parallel/sharding.h"

namespace megatron {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

GPTModel::GPTModel(const ModelConfig& c, const tp::TensorParallel& tp) : config_(c), tp_(tp) {
  TORCH_CHECK(c.padded_vocab_size % tp.size() == 0, "padded vocabulary does not split across tensor-parallel ranks");
  const int64_t local_vocab = c.padded_vocab_size / tp.size();
  auto embedding = register_module("embedding", std::make_shared<torch::nn::Module>());
  auto word = embedding->register_module("word_embeddings", std::make_shared<torch::nn::Module>());
  word_embeddings = word->register_parameter("weight", at::empty({local_vocab, c.hidden_size}));
  if (c.position_embedding_type == "learned_absolute") {
    auto pos = embedding->register_module("position_embeddings", std::make_shared<torch::nn::Module>());
    position_embeddings = pos->register_parameter("weight", at::empty({c.max_position_embeddings, c.hidden_size}));
  }
  auto decoder = register_module("decoder", std::make_shared<torch::nn::Module>());
  layers = decoder->register_module("layers", torch::nn::ModuleList());
  for (int i = 0; i < c.num_layers; ++i) layers->push_back(std::make_shared<TransformerLayer>(c, tp));
  auto final_norm = decoder->register_module("final_layernorm", std::make_shared<torch::nn::Module>());
  final_layernorm_weight = final_norm->register_parameter("weight", at::ones({c.hidden_size}));
  if (norm_kind_from_name(c.normalization) == NormKind::LayerNorm) {
    final_layernorm_bias = final_norm->register_parameter("bias", at::zeros({c.hidden_size}));
  }
  if (c.untie_embeddings_and_output_weights) {
    auto out = register_module("output_layer", std::make_shared<torch::nn::Module>());
    output_layer_weight = out->register_parameter("weight", at::empty({local_vocab, c.hidden_size}));
  }
}

void GPTModel::initialize(uint64_t seed) {
  at::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const double std = config_.init_method_std;
  const double output_std = std / std::sqrt(2.0 * config_.num_layers);
  for (auto& item : named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    at::Tensor& p = item.value();
    const tp::ShardSpec spec = tp::shard_spec(name, config_.swiglu);
    const std::vector<int64_t> shape = tp::full_shape(p.sizes(), spec, tp_.size());
    at::Tensor value;
    if (name.find("layer_norm_weight") != std::string::npos || name.find("layernorm") != std::string::npos) {
      value = ends_with(name, "bias") ? at::zeros(shape) : at::ones(shape);
    } else if (ends_with(name, "bias")) {
      value = at::zeros(shape);
    } else {
      const bool into_residual = ends_with(name, "linear_proj.weight") || ends_with(name, "linear_fc2.weight");
      value = at::empty(shape, at::kFloat).normal_(0.0, into_residual ? output_std : std, gen);
    }
    p.copy_(tp::shard_of(value, spec, tp_.rank(), tp_.size()));
  }
}

const RopeTables* GPTModel::rope_for(int64_t seq_len, const at::Device& device) {
  if (config_.position_embedding_type != "rope") return nullptr;
  if (!rope_ || rope_->cos.size(0) < seq_len || rope_->cos.device() != device) {
    rope_ = make_rope_tables(config_, std::max<int64_t>(seq_len, config_.seq_length), device);
  }
  return &*rope_;
}

at::Tensor GPTModel::forward(const at::Tensor& tokens, const at::Tensor& position_ids, const at::Tensor& attention_mask) {
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
  hidden = tp_.random(sharded, [&] { return at::dropout(hidden, config_.hidden_dropout, is_training()); });
  const RopeTables* tables = rope_for(s, tokens.device());
  std::optional<RopeTables> gathered;  // per-sample positions: the tables' rows for them
  if (tables != nullptr && position_ids.defined()) {
    gathered = gather_rope_tables(*tables, position_ids);
    tables = &*gathered;
  }
  for (const auto& module : *layers) {
    if (before_use) before_use(module->parameters());
    hidden = module->as<TransformerLayer>()->forward(hidden, tables, attention_mask);
  }
  if (before_use) before_use({final_layernorm_weight, final_layernorm_bias, output_layer_weight});
  hidden = apply_norm(hidden, final_layernorm_weight, final_layernorm_bias,
                      norm_kind_from_name(config_.normalization), config_.norm_epsilon);
  const at::Tensor& out_weight = output_layer_weight.defined() ? output_layer_weight : word_embeddings;
  // The output layer is column-parallel over the vocabulary.
  hidden = tp_.sequence_parallel ? tp::gather_from_sp(hidden, tp_.group) : tp::copy_to_tp(hidden, tp_.group);
  return at::linear(hidden, out_weight);                                       // [s, b, V/tp]
}

at::Tensor GPTModel::token_losses(const Batch& batch) {
  at::Tensor logits = forward(batch.tokens, batch.position_ids, batch.attention_mask);  // [s, b, V]
  const int64_t s = logits.size(0), b = logits.size(1), v = logits.size(2);
  if (tp_.size() > 1) return tp::vocab_parallel_cross_entropy(logits, batch.labels.t(), tp_.group).t();  // [b, s]
  // Cross entropy in fp32, as Megatron does, whatever the activation dtype.
  at::Tensor losses = at::cross_entropy_loss(logits.to(at_least_fp32(logits.scalar_type())).view({s * b, v}), batch.labels.t().reshape({s * b}),
                                             /*weight=*/{}, at::Reduction::None);
  return losses.view({s, b}).t();                                              // [b, s]
}

at::Tensor GPTModel::loss(const Batch& batch) {
  at::Tensor losses = token_losses(batch);
  at::Tensor mask = batch.loss_mask.to(losses.scalar_type());
  return (losses * mask).sum() / mask.sum().clamp_min(1.0);
}

int64_t GPTModel::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : named_parameters()) {
    n += tp::shard_spec(p.key(), config_.swiglu).replicated() ? p.value().numel() : p.value().numel() * tp_.size();
  }
  return n;
}

}  // namespace megatron
