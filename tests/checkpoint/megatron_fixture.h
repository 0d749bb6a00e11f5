// What the `megatron convert --from megatron` tests share: megatron-core's fixture
// (make_megatron_checkpoint.py) written once per suite, and the loss of a converted checkpoint on
// the batch megatron-core scored.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/config_json.h"
#include "model/gpt_model.h"
#include "support/test_support.h"

namespace megatron::test {

// Runs make_megatron_checkpoint.py with `flags` into `out`; its reference.json.
inline nlohmann::json make_megatron_fixture(const std::string& out, const std::string& flags) {
  auto made = run_command(shell_quote(venv_python()) + " " + shell_quote(source_dir() + "/tests/checkpoint/make_megatron_checkpoint.py") +
                          " --out " + shell_quote(out) + " " + flags);
  if (made.status != 0) throw std::runtime_error("make_megatron_checkpoint.py " + flags + " failed:\n" + made.output);
  return nlohmann::json::parse(std::ifstream(out + "/reference.json"));
}

inline at::Tensor int_matrix(const nlohmann::json& rows) {
  std::vector<int64_t> flat;
  for (const auto& row : rows) {
    for (const auto& v : row) flat.push_back(v.get<int64_t>());
  }
  return at::tensor(flat, at::kLong).reshape({int64_t(rows.size()), -1});
}

// The batch megatron-core scored (all tokens count).
inline Batch reference_batch(const nlohmann::json& reference) {
  Batch batch;
  batch.tokens = int_matrix(reference.at("tokens"));
  batch.labels = int_matrix(reference.at("labels"));
  batch.loss_mask = at::ones(batch.tokens.sizes(), at::kFloat);
  return batch;
}

// The model of the converted checkpoint under `dir`, in one process (whatever expert-parallel
// split it was written for).
inline std::unique_ptr<GPTModel> load_converted(const std::string& dir) {
  const std::string iter = latest_checkpoint_directory(dir);
  auto model = std::make_unique<GPTModel>(model_config_from_json(read_checkpoint_state(iter).at("model_config")));
  load_model_weights(iter, *model);
  return model;
}

// The converted model's mean loss on the reference batch.
inline double converted_loss(const std::string& dir, const nlohmann::json& reference) {
  auto model = load_converted(dir);
  model->eval();
  at::NoGradGuard no_grad;
  return model->loss(reference_batch(reference)).item<double>();
}

// The first multi-token prediction depth's mean loss on the reference batch (its tokens and
// labels one further ahead), which only a training forward computes (the fixture's dropout is 0).
inline double converted_mtp_loss(const std::string& dir, const nlohmann::json& reference) {
  auto model = load_converted(dir);
  model->train();
  model->loss(reference_batch(reference));
  return model->take_mtp_losses()[0].item<double>();
}

// `megatron convert --from megatron --to native --load from --save to [extra...]`.
inline CommandResult convert_from_megatron(const std::string& from, const std::string& to, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"convert", "--from", "megatron", "--to", "native", "--load", from, "--save", to};
  args.insert(args.end(), extra.begin(), extra.end());
  return run_megatron(args);
}

}  // namespace megatron::test
