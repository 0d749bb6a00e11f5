// Damaged or mismatched checkpoints are errors naming the file and tensor or field (exit 2),
// never silent garbage and never a half-published output (issue #26): a stored dtype edited from
// F32 to I32 (every offset stays valid, the data's crc32 too), HF tensors whose shapes disagree
// with config.json (a transposed one would reshape into garbage), config.json fields of the wrong
// type or range (zero heads divided by), tensors nothing uses found only after writing, a
// state.json field of the wrong type, generator states of another dtype.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_export.h"
#include "checkpoint/hf_mapping.h"
#include "checkpoint/safetensors.h"
#include "core/files.h"
#include "model/gpt_model.h"
#include "support/model_configs.h"
#include "support/test_support.h"
#include "support/user_error.h"

namespace megatron {
namespace {
namespace fs = std::filesystem;
using test::user_error_of;

// Rewrites the JSON header of safetensors file `path` through `edit`; the data section (and the
// crc32 of it the metadata holds) stays as it was.
void edit_header(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  const std::string bytes = read_file(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  edit(header);
  const std::string json = header.dump();
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(char(uint64_t(json.size()) >> (8 * i)));
  std::ofstream(path, std::ios::binary) << out << json << bytes.substr(8 + n);
}

void edit_json(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(read_file(path));
  edit(j);
  std::ofstream(path) << j.dump(2);
}

// A tiny Llama as an HF directory, written by our own exporter (config.json, model.safetensors
// with its crc32): hidden 32, 4 heads of 8 in 2 groups, MLP 64, vocabulary 64.
void make_tiny_hf(const std::string& dir) {
  const ModelConfig m = test::small_llama({32, 4, 2, 64, 16, 64});
  GPTModel shapes(m, {}, std::nullopt, std::nullopt, at::kMeta);
  std::map<std::string, std::vector<int64_t>> shape_of;
  for (const auto& p : shapes.named_parameters()) shape_of[p.key()] = p.value().sizes().vec();
  at::manual_seed(0);
  save_hf_checkpoint(dir, m, 64, [&](const std::string& name) { return at::randn(shape_of.at(name)) * 0.02; }, {});
}

struct Converted {
  test::CommandResult run;
  bool published_nothing;  // no tracker, no iteration directory, no temporary directory left
};

Converted convert_from_hf(const std::string& hf, const std::string& save) {
  Converted c{test::run_megatron({"convert", "--from", "hf", "--to", "native", "--load", hf, "--save", save}), true};
  if (fs::exists(save)) {
    for (const auto& entry : fs::directory_iterator(save)) c.published_nothing = false, (void)entry;
  }
  return c;
}

TEST(BadCheckpoints, HfTensorStoredAsIntegersIsRefusedAndNothingIsPublished) {
  test::TempDir dir;
  make_tiny_hf(dir / "hf");
  ASSERT_EQ(convert_from_hf(dir / "hf", dir / "good").run.status, 0);  // the unedited directory converts
  edit_header(dir / "hf/model.safetensors", [](nlohmann::json& h) { h["model.layers.0.mlp.down_proj.weight"]["dtype"] = "I32"; });
  const Converted c = convert_from_hf(dir / "hf", dir / "out");
  EXPECT_EQ(c.run.status, 2) << c.run.output;
  EXPECT_NE(c.run.output.find("model.safetensors: tensor 'model.layers.0.mlp.down_proj.weight' is stored as I32, not a floating-point"),
            std::string::npos)
      << c.run.output;
  EXPECT_TRUE(c.published_nothing);
}

// Shapes come from config.json: a k_proj stored transposed has the right number of elements (the
// fused reshape would take it) but not the right shape; an MLP narrower in config.json than in
// the file likewise; an embedding of other rows than vocab_size.
TEST(BadCheckpoints, HfTensorShapesAreCheckedAgainstConfigJson) {
  test::TempDir dir;
  make_tiny_hf(dir / "hf");
  auto expect = [&](const std::string& want) {
    const Converted c = convert_from_hf(dir / "hf", dir / "out");
    EXPECT_EQ(c.run.status, 2) << c.run.output;
    EXPECT_NE(c.run.output.find(want), std::string::npos) << c.run.output;
    EXPECT_TRUE(c.published_nothing);
  };
  edit_header(dir / "hf/model.safetensors", [](nlohmann::json& h) { h["model.layers.1.self_attn.k_proj.weight"]["shape"] = {32, 16}; });
  expect("tensor 'model.layers.1.self_attn.k_proj.weight' has shape [32, 16]; " + (dir / "hf") + "/config.json makes it [16, 32]");
  edit_header(dir / "hf/model.safetensors", [](nlohmann::json& h) { h["model.layers.1.self_attn.k_proj.weight"]["shape"] = {16, 32}; });
  edit_json(dir / "hf/config.json", [](nlohmann::json& j) { j["intermediate_size"] = 48; });
  expect("tensor 'model.layers.0.mlp.gate_proj.weight' has shape [64, 32]; " + (dir / "hf") + "/config.json makes it [48, 32]");
  edit_json(dir / "hf/config.json", [](nlohmann::json& j) {
    j["intermediate_size"] = 64;
    j["vocab_size"] = 400000000;  // a vocabulary the file does not have: refused before anything is allocated for it
  });
  expect("tensor 'model.embed_tokens.weight' has shape [64, 32]; " + (dir / "hf") + "/config.json makes it [400000000, 32]");
}

TEST(BadCheckpoints, HfTensorNothingUsesPublishesNothing) {
  test::TempDir dir;
  make_tiny_hf(dir / "hf");
  SafetensorsFile original(dir / "hf/model.safetensors");
  std::vector<SafetensorsEntry> tensors;
  for (const auto& name : original.names()) tensors.push_back({name, original.load(name)});
  tensors.push_back({"model.layers.0.mlp.extra_proj.weight", at::zeros({4, 4})});
  save_safetensors(dir / "hf/model.safetensors", tensors);
  const Converted c = convert_from_hf(dir / "hf", dir / "out");
  EXPECT_EQ(c.run.status, 2) << c.run.output;
  EXPECT_NE(c.run.output.find("tensor 'model.layers.0.mlp.extra_proj.weight' has no place in the model"), std::string::npos)
      << c.run.output;
  EXPECT_TRUE(c.published_nothing) << "a complete-looking checkpoint that train --load would accept";
}

TEST(BadCheckpoints, HfConfigFieldsOfTheWrongTypeOrRangeNameTheField) {
  test::TempDir dir;
  make_tiny_hf(dir / "hf");
  const nlohmann::json good = nlohmann::json::parse(read_file(dir / "hf/config.json"));
  auto error_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    std::ofstream(dir / "hf/config.json") << j.dump();
    return user_error_of([&] { model_config_from_hf(dir / "hf"); });
  };
  const std::string path = (dir / "hf") + "/config.json: ";
  EXPECT_EQ(error_with([](nlohmann::json&) {}), "");
  EXPECT_EQ(error_with([](nlohmann::json& j) { j["num_attention_heads"] = 0; }),
            path + "num_attention_heads must be an integer from 1 to 2147483647, got 0");
  EXPECT_EQ(error_with([](nlohmann::json& j) { j["hidden_size"] = "32"; }),
            path + "hidden_size must be an integer from 1 to 2147483647, got \"32\"");
  EXPECT_EQ(error_with([](nlohmann::json& j) { j["num_hidden_layers"] = 4294967298ll; }),
            path + "num_hidden_layers must be an integer from 1 to 2147483647, got 4294967298");
  EXPECT_EQ(error_with([](nlohmann::json& j) { j["rms_norm_eps"] = -1; }), path + "rms_norm_eps must be a finite number above 0, got -1");
  EXPECT_EQ(error_with([](nlohmann::json& j) { j["tie_word_embeddings"] = "no"; }), path + "tie_word_embeddings must be true or false, got \"no\"");
  EXPECT_EQ(error_with([](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", "8"}}; }),
            path + "rope_scaling.factor must be a finite number above 0, got \"8\"");
  EXPECT_EQ(error_with([](nlohmann::json& j) { j = nlohmann::json::array(); }), path + "expected a JSON object of model settings, got array");
  // Zero heads' worth of head size (hidden_size below the head count, no head_dim): was SIGFPE.
  EXPECT_NE(error_with([](nlohmann::json& j) {
              j["hidden_size"] = 2;
              j.erase("head_dim");
            }).find("the head size is 0"),
            std::string::npos);
  EXPECT_NE(error_with([](nlohmann::json& j) { j["num_key_value_heads"] = 3; }).find("must be a multiple of num_key_value_heads (3)"),
            std::string::npos);
  EXPECT_NE(error_with([](nlohmann::json& j) {
              j["vocab_size"] = 2000000000;
              j["hidden_size"] = 1048576;
              j["head_dim"] = 8;
            }).find("the embedding (vocab_size x hidden_size) has 2.09715e+15 elements, more than any machine holds"),
            std::string::npos);
  // A sharded directory's index without a weight map.
  error_with([](nlohmann::json&) {});
  std::ofstream(dir / "hf/model.safetensors.index.json") << "{\"metadata\": {}}";
  EXPECT_EQ(user_error_of([&] { HfCheckpointReader reader(dir / "hf"); }),
            (dir / "hf") + "/model.safetensors.index.json: no \"weight_map\" object (tensor name -> shard file)");
}

// A native checkpoint edited after saving: each reader refuses what it cannot use, naming it.
TEST(BadCheckpoints, NativeCheckpointStoredDtypesAndStateFieldsAreChecked) {
  test::TempDir dir;
  auto train = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"--train-iters", "2", "--lr-warmup-iters", "0", "--eval-iters", "0", "--save", dir / "ckpt",
                                     "--save-interval", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    return test::run_megatron(test::tiny_cpu_train(args));
  };
  ASSERT_EQ(train({}).status, 0);
  const std::string iter = dir / "ckpt/iter_0000002";
  auto resume = [&](const std::string& want) {
    const auto r = train({"--load", dir / "ckpt", "--train-iters", "3"});
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(want), std::string::npos) << r.output;
  };
  const std::string weight = "decoder.layers.1.mlp.linear_fc2.weight";
  edit_header(iter + "/model.safetensors", [&](nlohmann::json& h) { h[weight]["dtype"] = "I32"; });
  resume(iter + "/model.safetensors: tensor '" + weight + "' is stored as I32, not a floating-point dtype");
  // Read through the resharding reader (convert --to hf reads any layout that way).
  const auto to_hf = test::run_megatron({"convert", "--from", "native", "--to", "hf", "--load", dir / "ckpt", "--save", dir / "hf"});
  EXPECT_EQ(to_hf.status, 2) << to_hf.output;
  EXPECT_NE(to_hf.output.find("tensor '" + weight + "' is stored as I32"), std::string::npos) << to_hf.output;
  edit_header(iter + "/model.safetensors", [&](nlohmann::json& h) { h[weight]["dtype"] = "F32"; });

  edit_header(iter + "/optimizer.safetensors", [&](nlohmann::json& h) { h[weight + ".exp_avg_sq"]["dtype"] = "I32"; });
  resume(iter + "/optimizer.safetensors: tensor '" + weight + ".exp_avg_sq' is stored as I32");
  edit_header(iter + "/optimizer.safetensors", [&](nlohmann::json& h) { h[weight + ".exp_avg_sq"]["dtype"] = "F32"; });

  edit_header(iter + "/rng.safetensors", [&](nlohmann::json& h) { h["cpu"]["dtype"] = "I8"; });
  resume(iter + "/rng.safetensors: tensor 'cpu' is stored as I8; a generator state is U8");
  edit_header(iter + "/rng.safetensors", [&](nlohmann::json& h) {
    h["cpu"]["dtype"] = "U8";
    const int64_t bytes = h["cpu"]["shape"][0].get<int64_t>();  // one byte short: not a state PyTorch takes
    h["cpu"]["shape"] = {bytes - 1};
    h["cpu"]["data_offsets"][1] = h["cpu"]["data_offsets"][1].get<int64_t>() - 1;
    h["__padding"] = {{"dtype", "U8"}, {"shape", {1}}, {"data_offsets", {h["cpu"]["data_offsets"][1], h["cpu"]["data_offsets"][1].get<int64_t>() + 1}}};
  });
  resume(iter + "/rng.safetensors: a generator state is not one PyTorch's generators take");
}

TEST(BadCheckpoints, StateJsonFieldOfTheWrongTypeIsAnErrorNamingIt) {
  test::TempDir dir;
  const auto args = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"--train-iters", "1", "--lr-warmup-iters", "0", "--eval-iters", "0", "--save", dir / "ckpt",
                                  "--save-interval", "1"};
    a.insert(a.end(), extra.begin(), extra.end());
    return test::tiny_cpu_train(a);
  };
  ASSERT_EQ(test::run_megatron(args({})).status, 0);
  edit_json(dir / "ckpt/iter_0000001/state.json", [](nlohmann::json& j) { j["parallel"] = 5; });
  const auto r = test::run_megatron(args({"--load", dir / "ckpt", "--train-iters", "2"}));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("iter_0000001/state.json: a field is missing or of the wrong type"), std::string::npos) << r.output;

  // Sizes each in range whose product is not a count of files (the reader lists every file name).
  edit_json(dir / "ckpt/iter_0000001/state.json", [](nlohmann::json& j) {
    j["parallel"] = {{"tensor_model_parallel_size", 1 << 20}, {"pipeline_model_parallel_size", 1 << 20}, {"data_parallel_size", 1 << 20}};
  });
  const auto to_hf = test::run_megatron({"convert", "--from", "native", "--to", "hf", "--load", dir / "ckpt", "--save", dir / "hf"});
  EXPECT_EQ(to_hf.status, 2) << to_hf.output;
  EXPECT_NE(to_hf.output.find("iter_0000001/state.json: parallel: tensor 1048576 x pipeline 1048576 x (data 1048576 + expert 1) "
                              "parallel ranks is more than 2^20 files"),
            std::string::npos)
      << to_hf.output;
}

// The model a native checkpoint records (state.json's model_config) is checked before convert
// or generate builds it: a field of the wrong type or range, impossible sizes, a missing record,
// a state.json that is not an object -- each an error naming the file (found by the
// native_checkpoint fuzz target: a missing model_config was an internal JSON error).
TEST(BadCheckpoints, SavedModelConfigIsCheckedBeforeConvertOrGenerateBuildsIt) {
  test::TempDir dir;
  ASSERT_EQ(test::run_megatron(test::tiny_cpu_train({"--train-iters", "1", "--lr-warmup-iters", "0", "--eval-iters", "0", "--save",
                                                     dir / "ckpt"})).status, 0);
  const std::string state = dir / "ckpt/iter_0000001/state.json";
  const std::string original = read_file(state);
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& j) { j.erase("model_config"); }, "records no model"},
      {[](nlohmann::json& j) { j["model_config"]["num_attention_heads"] = 0; }, "model_config.num_attention_heads must be an integer from 1"},
      {[](nlohmann::json& j) { j["model_config"]["hidden_size"] = "64"; }, "model_config.hidden_size must be an integer from 1"},
      {[](nlohmann::json& j) { j["model_config"]["norm_epsilon"] = -1; }, "model_config.norm_epsilon must be a finite number above 0"},
      {[](nlohmann::json& j) { j["model_config"]["num_query_groups"] = 3; }, "must be a multiple of num_key_value_heads"},
      {[](nlohmann::json& j) { j["model_config"]["num_layers"] = 100000; }, "num_layers above 4096"},
      {[](nlohmann::json& j) { j["model_config"]["normalization"] = "BatchNorm"; }, "normalization must be LayerNorm or RMSNorm"},
      {[](nlohmann::json& j) { j["model_config"]["moe_router_load_balancing_type"] = "sinkhorn"; },
       "model_config.moe_router_load_balancing_type must be a non-empty list of strings"},
      {[](nlohmann::json& j) { j = 5; }, "state.json is corrupt: expected a JSON object"},
      {[](nlohmann::json& j) { j["format_version"] = "1"; }, "unsupported checkpoint format version \"1\""},
  };
  for (const auto& [edit, message] : cases) {
    std::ofstream(state) << original;
    edit_json(state, edit);
    for (const std::vector<std::string>& command :
         {std::vector<std::string>{"convert", "--from", "native", "--to", "hf", "--load", dir / "ckpt", "--save", dir / "hf"},
          std::vector<std::string>{"generate", "--load", dir / "ckpt", "--prompt", "x", "--max-new-tokens", "1"}}) {
      const auto r = test::run_megatron(command);
      EXPECT_EQ(r.status, 2) << command[0] << ": " << message << "\n" << r.output;
      EXPECT_NE(r.output.find("iter_0000001/state.json"), std::string::npos) << command[0] << "\n" << r.output;
      EXPECT_NE(r.output.find(message), std::string::npos) << command[0] << ": expected '" << message << "'\n" << r.output;
    }
    EXPECT_FALSE(fs::exists(dir / "hf")) << message;
  }
}

}  // namespace
}  // namespace megatron
