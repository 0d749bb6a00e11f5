// Resharding reads only what a rank needs: from a checkpoint saved under TP=2 x DP=2 with the
// distributed optimizer, the TP-rank-0 shards (and one DP slice of its optimizer state) are
// read with every other rank's files deleted, and equal what those files held; a whole
// tensor (TP=1) joins both shards; a different TP split (TP=4) takes quarter slices.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/reshard.h"
#include "checkpoint/safetensors.h"
#include "core/config_json.h"
#include "model/gpt_model.h"
#include "support/test_support.h"
#include "tensor_parallel/sharding.h"

namespace megatron {
namespace {
namespace fs = std::filesystem;

TEST(ReshardReads, EachRankReadsOnlyTheFilesItNeeds) {
  test::TempDir dir;
  auto run = test::run_megatron({"launch", "--nproc-per-node", "4", "--master-port", "0", "train", "--num-layers", "2",
                                 "--hidden-size", "64", "--num-attention-heads", "4", "--ffn-hidden-size", "128", "--swiglu",
                                 "--seq-length", "32", "--micro-batch-size", "2", "--train-iters", "2", "--lr", "1e-3",
                                 "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "200", "--device", "cpu",
                                 "--cpu-threads", "1", "--tensor-model-parallel-size", "2", "--use-distributed-optimizer",
                                 "--save", dir / "ckpt"});
  ASSERT_EQ(run.status, 0) << run.output;
  const std::string iter = latest_checkpoint_directory(dir / "ckpt");
  const nlohmann::json state = read_checkpoint_state(iter);
  const std::string fc1 = "decoder.layers.0.mlp.linear_fc1.weight", proj = "decoder.layers.1.self_attention.linear_proj.weight";
  const int64_t rows = state.at("model").at("padded_vocab_size").get<int64_t>();
  // How each parameter splits, as the saved model describes it.
  const tp::ParamTable params = describe_model(model_config_from_json(state.at("model_config")));

  // What a TP=1 reader assembles, before any file goes.
  std::map<std::string, at::Tensor> whole;
  {
    ShardedCheckpointReader reader(iter, state, params);
    for (const auto& name : {fc1, proj, std::string("embedding.word_embeddings.weight")}) whole[name] = reader.model(name, rows).clone();
    // A different split: TP=4 rank 1 takes the second quarter of each [gate; up] half.
    const at::Tensor quarter = reader.model(fc1, rows, 1, 4);
    const at::Tensor gate = whole[fc1].narrow(0, 0, 128), up = whole[fc1].narrow(0, 128, 128);
    EXPECT_TRUE(at::equal(quarter, at::cat({gate.narrow(0, 32, 32), up.narrow(0, 32, 32)})));
    // Vocabulary rows grown: zero-filled at the end.
    const at::Tensor grown = reader.model("embedding.word_embeddings.weight", rows + 64);
    EXPECT_TRUE(at::equal(grown.narrow(0, 0, rows), whole["embedding.word_embeddings.weight"]));
    EXPECT_EQ(grown.narrow(0, rows, 64).abs().sum().item<double>(), 0.0);
  }
  SafetensorsFile tp0(iter + "/" + checkpoint_part_name("model", 0, 0));
  const at::Tensor fc1_tp0 = tp0.load(fc1), proj_tp0 = tp0.load(proj);
  EXPECT_TRUE(at::equal(fc1_tp0, tp::shard_of(whole[fc1], params.at(fc1).split, 0, 2)));
  EXPECT_TRUE(at::equal(proj_tp0, tp::shard_of(whole[proj], params.at(proj).split, 0, 2)));
  SafetensorsFile dp0(iter + "/" + checkpoint_part_name("optimizer", 0, 0, 0));
  const int64_t offset = std::stoll(dp0.metadata().at("offset/" + fc1));
  const at::Tensor moments = dp0.load(fc1 + ".exp_avg").reshape({-1});

  // Without TP rank 1's files and DP rank 1's optimizer slice, TP rank 0 still gets its shards
  // and a range inside DP rank 0's slice.
  fs::remove(iter + "/" + checkpoint_part_name("model", 1, 0));
  fs::remove(iter + "/" + checkpoint_part_name("optimizer", 1, 0, 0));
  fs::remove(iter + "/" + checkpoint_part_name("optimizer", 1, 0, 1));
  fs::remove(iter + "/" + checkpoint_part_name("optimizer", 0, 0, 1));
  ShardedCheckpointReader reader(iter, state, params);
  EXPECT_TRUE(at::equal(reader.model(fc1, rows, 0, 2), fc1_tp0));
  EXPECT_TRUE(at::equal(reader.model(proj, rows, 0, 2), proj_tp0));
  const int64_t numel = std::min<int64_t>(100, moments.numel());
  EXPECT_TRUE(at::equal(reader.optimizer(fc1, "exp_avg", rows, 0, 2, offset, numel), moments.narrow(0, 0, numel)));
  // What needs the deleted files says so, naming the file or the gap.
  try {
    reader.model(fc1, rows, 1, 2);
    FAIL() << "read TP rank 1's shard without its file";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("model_tp01_pp000.safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace megatron
