// A program with a model family of its own: the Llama family with its MLP swapped for a wide,
// non-gated GELU feed-forward (h -> 3h -> h) whose parameters have names nothing else in the
// system knows (`mlp.expand.weight`, `mlp.contract.weight`, `mlp.norm.weight`) and an HF layout
// of its own (`mlp.fc_in`, `mlp.fc_out`, model_type "wide_mlp"). It adds a record and a spec and
// runs the stock train / convert / launch subcommands: no trainer, gradient buffer, checkpoint,
// reshard or HF code knows about it. Its loss reports a term of its own ("lm loss x2") in the
// log line. tests/model/test_custom_family.cpp drives it.
//   megatron_custom_family train|convert|launch [args]
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/errors.h"
#include "model/family.h"
#include "model/norm_module.h"

namespace megatron {
namespace {

class WideMlp : public FeedForward {
 public:
  explicit WideMlp(const PartContext& ctx) {
    const int64_t h = ctx.config.hidden_size;
    norm_ = register_module("norm", std::make_shared<NormModule>(ctx.config, ctx.tp, ctx.device));
    expand = register_module("expand", std::make_shared<tp::ColumnParallelLinear>(h, 3 * h, false, ctx.tp,
                                                                                  ctx.linear(tp::Init::Normal)));
    contract = register_module("contract", std::make_shared<tp::RowParallelLinear>(3 * h, h, false, ctx.tp,
                                                                                   ctx.linear(tp::Init::ScaledNormal)));
  }
  std::optional<NormParams> fused_norm() const override { return norm_->params(); }
  at::Tensor forward(const at::Tensor& normed) override {
    return contract->forward(at::gelu(expand->forward(normed)));  // [s, b, 3h/tp] between
  }

  std::shared_ptr<tp::ColumnParallelLinear> expand;    // weight [3h/tp, h]
  std::shared_ptr<tp::RowParallelLinear> contract;     // weight [h, 3h/tp]

 private:
  std::shared_ptr<NormModule> norm_;  // the pre-MLP norm lives in the part
};

ModelFamily wide_mlp_family() {
  ModelFamily f = family_with_preset("llama3");  // the attention, embedding and head stay Llama's
  f.name = "wide-mlp";
  f.presets.clear();
  f.hf_model_types = {"wide_mlp"};
  f.describes = [](const ModelConfig&) { return false; };  // only by name: the config's record
  f.layer_spec = [](const ModelConfig& c) {
    LayerSpec spec = gpt_layer_spec(c);
    spec.feed_forward = [](const PartContext& ctx) { return std::make_shared<WideMlp>(ctx); };
    return spec;
  };
  const auto llama_to_hf = f.config_to_hf;
  f.config_to_hf = [llama_to_hf](const ModelConfig& m, int64_t vocab, at::ScalarType dtype) {
    nlohmann::json j = llama_to_hf(m, vocab, dtype);
    j["model_type"] = "wide_mlp";
    j["architectures"] = {"WideMlpForCausalLM"};
    return j;
  };
  const auto llama_from_hf = f.config_from_hf;
  f.config_from_hf = [llama_from_hf](const nlohmann::json& j, const std::string& path) {
    nlohmann::json as_llama = j;
    as_llama["model_type"] = "llama";
    return llama_from_hf(as_llama, path);
  };
  std::vector<HfWeightRule> rows;
  for (const auto& rule : f.weights) {
    if (rule.megatron.find(".mlp.") == std::string::npos) rows.push_back(rule);
  }
  const std::string L = "decoder.layers.{layer}.", H = "model.layers.{layer}.";
  rows.push_back({L + "mlp.norm.weight", {H + "post_attention_layernorm.weight"}});
  rows.push_back({L + "mlp.expand.weight", {H + "mlp.fc_in.weight"}});
  rows.push_back({L + "mlp.contract.weight", {H + "mlp.fc_out.weight"}});
  f.weights = rows;
  // A loss of its own with a named term, reported in the log line next to "lm loss".
  f.loss = [](const at::Tensor& token_losses, const Batch& batch) {
    MicroBatchLoss l = masked_token_mean(token_losses, batch);
    l.terms["lm loss x2"] = 2.0 * l.loss.detach();
    return l;
  };
  f.loss_terms = {"lm loss x2"};
  return f;
}

}  // namespace
}  // namespace megatron

int main(int argc, char** argv) {
  megatron::cli::set_up_under_launch();
  if (argc < 2) {
    std::fprintf(stderr, "usage: megatron_custom_family train|convert|launch [args]\n");
    return 2;
  }
  static const megatron::ModelFamily family = megatron::wide_mlp_family();
  const std::string name = argv[1];
  const megatron::cli::Args args(argv + 2, argv + argc);
  return megatron::cli::run_reporting_errors([&] {
    if (name == "train") return megatron::cli::train_as(family, args);
    if (name == "convert") return megatron::cli::convert_as(family, args);
    if (name == "launch") return megatron::cli::launch(args);  // the ranks run this program again
    throw megatron::UserError("unknown subcommand '" + name + "' (train, convert, launch)");
  });
}
