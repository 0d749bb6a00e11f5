// The Megatron model, optimizer and logging flags of real launch scripts (issue #25), each
// tested by its effect on tiny CPU runs:
//  - --apply-layernorm-1p stores every norm weight as gamma - 1: the run trains as the plain one
//    (the same gradients reach the same scales), its checkpoint holds the shifted weights and its
//    HF export the plain ones;
//  - --calculate-per-token-loss is Megatron's normalisation: over uneven loss masks (EOD tokens
//    masked), four micro-batches of one sample train as one micro-batch of four, which the mean
//    of per-micro-batch means does not;
//  - --decoupled-lr / --decoupled-min-lr drive the embedding and output layer only;
//  - --rotary-seq-len-interpolation-factor divides the positions, and is HF's "linear" rope;
//  - Pai-Megatron-Patch's --extra-vocab-size counts from the tokenizer's base vocabulary;
//  - the optional TensorBoard series carry Megatron's tag names, and --log-params-norm /
//    --log-num-zeros-in-grad their log-line fields.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "checkpoint/safetensors.h"
#include "core/errors.h"
#include "model/parameter_names.h"
#include "model/rope.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer_test_util.h"
#include "train/arguments.h"

namespace megatron {
namespace {
namespace fs = std::filesystem;

std::vector<std::string> tiny(std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--eval-interval", "0", "--lr-warmup-iters", "0"});
  return test::tiny_cpu_train(extra);
}

// `train --load-hf DIR` with tiny_cpu.yaml's run settings (its model flags come from DIR).
std::vector<std::string> from_hf(const std::string& dir, std::vector<std::string> extra) {
  std::vector<std::string> args = {"train", "--load-hf", dir, "--seq-length", "64", "--micro-batch-size", "4", "--global-batch-size", "8",
                                   "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "256",
                                   "--make-vocab-size-divisible-by", "64", "--lr", "3e-3", "--eval-interval", "0", "--device", "cpu",
                                   "--cpu-threads", "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::string read_file_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double relative, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], relative * std::abs(b[i])) << what << ", iteration " << i + 1;
}

TEST(MegatronModelFlags, LayerNorm1pTrainsAsTheShiftedGammaAndExportsTheScale) {
  test::TempDir dir;
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> flags = {"--train-iters", "3", "--metrics-jsonl", dir / (name + ".jsonl"), "--save", dir / name,
                                      "--save-hf", dir / (name + "_hf")};
    flags.insert(flags.end(), extra.begin(), extra.end());
    auto r = test::run_megatron(tiny(flags));
    EXPECT_EQ(r.status, 0) << r.output;
  };
  run("plain", {});
  run("one_p", {"--apply-layernorm-1p"});
  // d(1 + w)/dw = 1 and norms have no weight decay: the same updates, up to rounding.
  expect_close(test::jsonl_series(dir / "one_p.jsonl"), test::jsonl_series(dir / "plain.jsonl"), 1e-5, "--apply-layernorm-1p");

  const SafetensorsFile plain(dir / "plain/iter_0000003/model.safetensors"), one_p(dir / "one_p/iter_0000003/model.safetensors");
  int norms = 0;
  for (const std::string& name : plain.names()) {
    if (!is_norm_weight(name)) continue;
    ++norms;
    EXPECT_TRUE(at::allclose(one_p.view(name) + 1.0, plain.view(name), 0, 1e-5)) << name << " is not stored as gamma - 1";
  }
  EXPECT_EQ(norms, 2 * 2 + 1) << "two norms per layer and the final one";

  const SafetensorsFile plain_hf(dir / "plain_hf/model.safetensors"), one_p_hf(dir / "one_p_hf/model.safetensors");
  ASSERT_EQ(one_p_hf.names(), plain_hf.names());
  for (const std::string& name : plain_hf.names()) {
    EXPECT_TRUE(at::allclose(one_p_hf.view(name).to(at::kFloat), plain_hf.view(name).to(at::kFloat), 1e-4, 1e-5)) << name;
  }
  // Back from HF into a 1p model: the scales shifted again, the same first loss as the plain model's.
  auto one_p_from_hf = test::run_megatron(
      from_hf(dir / "plain_hf", {"--train-iters", "1", "--apply-layernorm-1p", "--metrics-jsonl", dir / "from_hf_1p.jsonl"}));
  ASSERT_EQ(one_p_from_hf.status, 0) << one_p_from_hf.output;
  auto plain_from_hf = test::run_megatron(from_hf(dir / "plain_hf", {"--train-iters", "1", "--metrics-jsonl", dir / "from_hf.jsonl"}));
  ASSERT_EQ(plain_from_hf.status, 0) << plain_from_hf.output;
  expect_close(test::jsonl_series(dir / "from_hf_1p.jsonl"), test::jsonl_series(dir / "from_hf.jsonl"), 1e-6, "1p model from HF");
}

TEST(MegatronModelFlags, PerTokenLossIsMegatronsNormalisationOnUnevenMasks) {
  test::TempDir dir;
  auto losses = [&](const std::string& name, std::vector<std::string> extra) {
    // Documents of 1 to 16 tokens in samples of 16: from one to eight EOD tokens masked.
    std::vector<std::string> flags = {"--train-iters", "3", "--seq-length", "16", "--global-batch-size", "4", "--eod-mask-loss",
                                      "--metrics-jsonl", dir / (name + ".jsonl")};
    flags.insert(flags.end(), extra.begin(), extra.end());
    auto r = test::run_megatron(tiny(flags));
    EXPECT_EQ(r.status, 0) << r.output;
    return test::jsonl_series(dir / (name + ".jsonl"));
  };
  const std::vector<double> one_micro_batch = losses("one", {"--micro-batch-size", "4"});
  const std::vector<double> per_token = losses("per_token", {"--micro-batch-size", "1", "--calculate-per-token-loss"});
  const std::vector<double> mean_of_means = losses("means", {"--micro-batch-size", "1"});
  ASSERT_EQ(one_micro_batch.size(), 3u);
  // The reported loss and the gradient both weigh every loss token of the global batch alike.
  expect_close(per_token, one_micro_batch, 2e-6, "per-token loss over 4 micro-batches vs one micro-batch of 4");
  // Without the flag, micro-batches with fewer loss tokens weigh more: the masks here are uneven.
  ASSERT_EQ(mean_of_means.size(), 3u);
  // Over two data-parallel ranks (Gloo), each with two micro-batches: the token count is the
  // global batch's, the gradients are summed over the ranks before the division.
  auto args = tiny({"--train-iters", "3", "--seq-length", "16", "--global-batch-size", "4", "--eod-mask-loss", "--micro-batch-size",
                    "1", "--calculate-per-token-loss", "--metrics-jsonl", dir / "dp2.jsonl"});
  args.insert(args.begin(), {"launch", "--nproc-per-node", "2", "--master-port", "0"});
  auto dp2 = test::run_megatron(args);
  ASSERT_EQ(dp2.status, 0) << dp2.output;
  expect_close(test::jsonl_series(dir / "dp2.jsonl"), one_micro_batch, 2e-6, "per-token loss over 2 data-parallel ranks");
  // At the start every token's loss is about ln(vocab), whatever the weighting; the iterations
  // after diverge.
  EXPECT_GT(std::abs(mean_of_means[2] - one_micro_batch[2]), 1e-4 * one_micro_batch[2])
      << "the masks are not uneven enough: " << mean_of_means[2] << " vs " << one_micro_batch[2];
}

TEST(MegatronModelFlags, DecoupledLearningRateDrivesTheEmbeddingAndOutputLayerOnly) {
  test::TempDir dir;
  auto run = [&](const std::string& name, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--metrics-jsonl", dir / (name + ".jsonl")});
    auto r = test::run_megatron(tiny(extra));
    EXPECT_EQ(r.status, 0) << r.output;
    return test::jsonl_series(dir / (name + ".jsonl"));
  };
  // Frozen at a decoupled rate of zero: after 1 and after 2 steps the same embedding and output
  // layer, while the other weights moved.
  run("frozen1", {"--train-iters", "1", "--decoupled-lr", "0", "--decoupled-min-lr", "0", "--save", dir / "one"});
  run("frozen2", {"--train-iters", "2", "--decoupled-lr", "0", "--decoupled-min-lr", "0", "--save", dir / "two"});
  const SafetensorsFile one(dir / "one/iter_0000001/model.safetensors"), two(dir / "two/iter_0000002/model.safetensors");
  for (const std::string& name : one.names()) {
    const bool decoupled = name == kWordEmbeddings || name == kOutputLayer;
    EXPECT_EQ(at::equal(one.view(name), two.view(name)), decoupled) << name;
  }
  // The decoupled rates equal to --lr / --min-lr: the run is the plain one, bit for bit.
  const auto plain = run("plain", {"--train-iters", "3"});
  EXPECT_EQ(run("same", {"--train-iters", "3", "--decoupled-lr", "3.0e-3", "--decoupled-min-lr", "3.0e-4"}), plain);
  // --decoupled-min-lr defaults to --min-lr, as Megatron.
  EXPECT_EQ(run("default_min", {"--train-iters", "3", "--decoupled-lr", "3.0e-3"}), plain);
  EXPECT_NE(run("faster", {"--train-iters", "3", "--decoupled-lr", "1.0e-2"}), plain);
}

TEST(MegatronModelFlags, RotaryInterpolationDividesThePositionsAndIsHfsLinearRope) {
  ModelConfig c;
  c.kv_channels = 16;
  c.position_embedding_type = "rope";
  const RopeTables plain = make_rope_tables(c, 16, at::kCPU);
  c.rotary_seq_len_interpolation_factor = 4.0;
  const RopeTables slowed = make_rope_tables(c, 16, at::kCPU);
  for (int64_t p : {0, 1, 3}) {
    EXPECT_TRUE(at::allclose(slowed.cos[4 * p], plain.cos[p], 0, 1e-6)) << "position " << 4 * p;
    EXPECT_TRUE(at::allclose(slowed.sin[4 * p], plain.sin[p], 0, 1e-6)) << "position " << 4 * p;
  }

  test::TempDir dir;
  auto saved = test::run_megatron(tiny({"--train-iters", "1", "--rotary-seq-len-interpolation-factor", "4", "--save-hf", dir / "hf"}));
  ASSERT_EQ(saved.status, 0) << saved.output;
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(dir / "hf/config.json"));
  EXPECT_EQ(config.at("rope_scaling"), (nlohmann::json{{"rope_type", "linear"}, {"factor", 4.0}})) << config.dump();
  auto contradicted = test::run_megatron(from_hf(dir / "hf", {"--train-iters", "1", "--rotary-seq-len-interpolation-factor", "2"}));
  EXPECT_EQ(contradicted.status, 2);
  EXPECT_NE(contradicted.output.find("--rotary-seq-len-interpolation-factor 2 contradicts"), std::string::npos) << contradicted.output;
  auto adopted = test::run_megatron(from_hf(dir / "hf", {"--train-iters", "1", "--save", dir / "ckpt"}));
  ASSERT_EQ(adopted.status, 0) << adopted.output;
  EXPECT_NE(read_file_text(dir / "ckpt/iter_0000001/state.json").find("\"rotary_seq_len_interpolation_factor\": 4.0"), std::string::npos)
      << "the factor comes from config.json";
  EXPECT_NE(test::run_megatron(tiny({"--rotary-seq-len-interpolation-factor", "0"})).output.find("must be a finite number > 0"),
            std::string::npos);
}

TEST(MegatronModelFlags, ExtraVocabSizeCountsFromTheBaseVocabularyAsPai) {
  const std::string qwen3 = tok_test::npm_dir() + "/tokenizer-qwen3/models";
  auto finalized = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--num-layers", "1", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
                                     "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
                                     "--patch-tokenizer-type", "Qwen3Tokenizer", "--tokenizer-model", qwen3};
    args.insert(args.end(), extra.begin(), extra.end());
    Config c = parse_train_arguments(args);
    finalize_config(c, 1);
    return c;
  };
  // Qwen's BPE holds 151643 ids and 26 added tokens follow; Pai's converted checkpoints have
  // 151643 + 293 = 151936 rows.
  EXPECT_EQ(finalized({}).model.padded_vocab_size, 151680);  // Megatron's padding of 151669
  EXPECT_EQ(finalized({"--extra-vocab-size", "293"}).model.padded_vocab_size, 151936);
  try {
    finalized({"--extra-vocab-size", "10"});
    ADD_FAILURE() << "10 extra rows cannot hold the 26 added tokens";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--extra-vocab-size 10: the tokenizer's 151643 base ids plus it (151653) must cover its 151669"),
              std::string::npos)
        << e.what();
  }
}

// `tag step value` lines of read_tensorboard.py, by tag.
std::map<std::string, std::map<int64_t, double>> tensorboard_scalars(const std::string& dir) {
  auto read = test::run_command(test::shell_quote(test::venv_python()) + " " +
                                test::shell_quote(test::source_dir() + "/tests/train/read_tensorboard.py") + " " + test::shell_quote(dir));
  EXPECT_EQ(read.status, 0) << read.output;
  std::map<std::string, std::map<int64_t, double>> out;
  std::istringstream lines(read.output);
  for (std::string line; std::getline(lines, line);) {
    const size_t value_at = line.rfind(' '), step_at = line.rfind(' ', value_at - 1);
    out[line.substr(0, step_at)][std::stoll(line.substr(step_at + 1, value_at - step_at - 1))] = std::stod(line.substr(value_at + 1));
  }
  return out;
}

TEST(MegatronModelFlags, OptionalTensorBoardSeriesCarryMegatronsTags) {
  test::TempDir dir;
  auto run = test::run_megatron(tiny({"--train-iters", "4", "--log-interval", "2", "--eval-interval", "2", "--eval-iters", "1",
                                      "--tensorboard-dir", dir / "tb", "--save", dir / "ckpt", "--log-params-norm",
                                      "--log-num-zeros-in-grad", "--log-timers-to-tensorboard", "--log-throughput",
                                      "--log-world-size-to-tensorboard", "--log-validation-ppl-to-tensorboard",
                                      "--log-memory-to-tensorboard"}));
  ASSERT_EQ(run.status, 0) << run.output;
  const auto scalars = tensorboard_scalars(dir / "tb");
  std::set<std::string> tags;
  for (const auto& [tag, values] : scalars) tags.insert(tag);
  // megatron/training/training.py's training_log and evaluate_and_print_results for these flags
  // (the mem-* series exist on CUDA only, where Megatron reads torch.cuda.memory_stats), and
  // megatron.cpp's own tokens/s series.
  const std::set<std::string> expected = {
      "learning-rate", "learning-rate vs samples", "batch-size", "batch-size vs samples", "lm loss", "lm loss vs samples",
      "loss-scale", "loss-scale vs samples", "world-size", "world-size vs samples", "grad-norm", "grad-norm vs samples",
      "num-zeros", "num-zeros vs samples", "params-norm", "params-norm vs samples", "iteration-time", "throughput",
      "lm loss validation", "lm loss validation vs samples", "lm loss validation ppl", "lm loss validation ppl vs samples",
      "throughput (tokens/s/GPU)"};
  EXPECT_EQ(tags, expected);
  EXPECT_EQ(scalars.at("world-size").at(3), 1.0);
  EXPECT_NEAR(scalars.at("lm loss validation ppl").at(2), std::exp(scalars.at("lm loss validation").at(2)),
              1e-5 * scalars.at("lm loss validation ppl").at(2));
  EXPECT_EQ(scalars.at("iteration-time").size(), 2u) << "one per log interval";
  const double zeros = scalars.at("num-zeros").at(4);
  EXPECT_EQ(zeros, std::floor(zeros));
  EXPECT_GE(zeros, 0.0);

  // The parameters' norm after step 4 is that of the weights the checkpoint holds (fp32 here).
  const SafetensorsFile weights(dir / "ckpt/iter_0000004/model.safetensors");
  double squares = 0;
  for (const std::string& name : weights.names()) squares += weights.view(name).to(at::kDouble).pow(2).sum().item<double>();
  EXPECT_NEAR(scalars.at("params-norm").at(4), std::sqrt(squares), 1e-5 * std::sqrt(squares));
  char field[64];
  std::snprintf(field, sizeof(field), " params norm: %.3f |", std::sqrt(squares));
  EXPECT_NE(run.output.find(field), std::string::npos) << field << " not in\n" << run.output;
  std::snprintf(field, sizeof(field), " num zeros: %.1f |", zeros);
  EXPECT_NE(run.output.find(field), std::string::npos) << field << " not in\n" << run.output;
}

}  // namespace
}  // namespace megatron
