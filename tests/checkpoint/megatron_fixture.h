// What the `megatron convert --from megatron` tests share: megatron-core's fixture
// (make_megatron_checkpoint.py) written once for all tests, and the loss of a converted checkpoint on
// the batch megatron-core scored.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/config_json.h"
#include "model/gpt_model.h"
#include "support/test_support.h"

namespace megatron::test {

// make_megatron_checkpoint.py's output for `flags` at `out` (a link), its reference.json. ctest runs
// each test in a process of its own, so every test of a suite would write the suite's fixtures
// again (5-15 s each): they are kept under $TMPDIR/megatron-test-fixtures, keyed by the script's
// text, the flags and the venv (megatron-core's version), written whole under a temporary name
// and renamed into place, so tests running at once never read a half-written one.
inline nlohmann::json make_megatron_fixture(const std::string& out, const std::string& flags) {
  const std::string script = source_dir() + "/tests/checkpoint/make_megatron_checkpoint.py";
  std::ifstream in(script, std::ios::binary);
  const std::string key_text = std::string(std::istreambuf_iterator<char>(in), {}) + "\n" + flags + "\n" + venv_python();
  uint64_t key = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : key_text) key = (key ^ c) * 1099511628211ull;
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path root = std::filesystem::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") / "megatron-test-fixtures";
  char name[17];
  std::snprintf(name, sizeof(name), "%016llx", static_cast<unsigned long long>(key));
  const std::filesystem::path cached = root / name;
  if (!std::filesystem::exists(cached / "reference.json")) {
    std::filesystem::create_directories(root);
    const std::filesystem::path staging = root / (std::string(name) + ".tmp." + std::to_string(::getpid()));
    std::filesystem::remove_all(staging);
    auto made = run_command(shell_quote(venv_python()) + " " + shell_quote(script) + " --out " + shell_quote(staging.string()) + " " + flags);
    if (made.status != 0) throw std::runtime_error("make_megatron_checkpoint.py " + flags + " failed:\n" + made.output);
    std::error_code raced;  // another test wrote the same fixture first: use that one
    std::filesystem::rename(staging, cached, raced);
    if (raced) std::filesystem::remove_all(staging);
  }
  std::filesystem::create_directory_symlink(cached, out);
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

// The fixture's --moe routing as `megatron train` flags (make_megatron_checkpoint.py's MOE_ARGS).
inline std::vector<std::string> fixture_moe_flags() {
  return {"--num-experts", "4", "--moe-ffn-hidden-size", "32", "--moe-router-topk", "2", "--moe-layer-freq", "[1,0,1]",
          "--moe-shared-expert-intermediate-size", "48", "--moe-shared-expert-gate", "--moe-router-score-function", "sigmoid",
          "--moe-router-enable-expert-bias", "--moe-router-topk-scaling-factor", "2.5", "--moe-router-load-balancing-type",
          "seq_aux_loss", "--moe-aux-loss-coeff", "1e-3", "--moe-router-dtype", "fp32"};
}

struct TrainedFromFixture {
  CommandResult run;
  std::vector<double> lm_losses;  // one per iteration, from --metrics-jsonl
};

// `megatron train --load native` up to iteration `iterations` on the indexed dataset the fixture
// under `fixture` wrote (--data), with the fixture's shape and flags (NullTokenizer: EOD = vocab
// size = 127; its split and seed, so the sample order is megatron-core's) plus `flags` (how to
// load: --finetune, or --no-load-optim --no-load-rng to go on; layers, attention, experts);
// scratch files under `work`.
inline TrainedFromFixture train_from_converted(const std::string& native, const std::string& fixture, const std::string& work,
                                               const std::vector<std::string>& flags, int iterations) {
  std::vector<std::string> args = {
      "train", "--load", native, "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
      "--seq-length", "16", "--max-position-embeddings", "16", "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
      "--untie-embeddings-and-output-weights", "--position-embedding-type", "rope", "--hidden-dropout", "0", "--attention-dropout", "0",
      "--tokenizer-type", "NullTokenizer", "--vocab-size", "127", "--micro-batch-size", "2", "--global-batch-size", "2",
      "--train-iters", std::to_string(iterations), "--lr", "1e-3", "--data-path", fixture + "/data_text_document", "--split",
      "100,0,0", "--seed", "1234", "--data-cache-path", work + "/cache", "--eval-interval", "0", "--log-interval", "1",
      "--metrics-jsonl", work + "/trained.jsonl", "--device", "cpu", "--cpu-threads", "1"};
  args.insert(args.end(), flags.begin(), flags.end());
  TrainedFromFixture out{run_megatron(args), {}};
  std::ifstream jsonl(work + "/trained.jsonl");
  for (std::string line; std::getline(jsonl, line);) out.lm_losses.push_back(nlohmann::json::parse(line).at("lm_loss").get<double>());
  return out;
}

}  // namespace megatron::test
