// Megatron-LM's and Pai-Megatron-Patch's flags that megatron.cpp does not implement
// (train/megatron_flags.h): the argument lists of real launch scripts are understood whole, each
// flag implemented, accepted with a notice or refused with what to use instead; a refused flag
// given Megatron's default value changes nothing and passes; every problem of a command line is
// reported at once; "did you mean" draws on every flag either parser knows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/errors.h"
#include "support/test_support.h"
#include "train/arguments.h"
#include "train/megatron_flags.h"

namespace megatron {
namespace {

// A recorded launch script's argument list (tests/fixtures/launch_scripts/NAME.args).
std::vector<std::string> script_args(const std::string& name) {
  std::ifstream in(test::source_dir() + "/tests/fixtures/launch_scripts/" + name + ".args");
  EXPECT_TRUE(in.good()) << name;
  std::vector<std::string> args;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#') args.push_back(line);
  }
  return args;
}

// The error of parsing `args`, "" when they parse.
std::string parse_error(const std::vector<std::string>& args) {
  try {
    parse_train_arguments(args);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// The flags an error message refuses as "not implemented yet".
std::set<std::string> not_yet(const std::string& error) {
  std::set<std::string> out;
  std::istringstream lines(error);
  for (std::string line; std::getline(lines, line);) {
    const size_t dash = line.find("--");
    if (dash == std::string::npos || line.find("is not implemented yet") == std::string::npos) continue;
    out.insert(line.substr(dash, line.find(' ', dash) - dash));
  }
  return out;
}

TEST(MegatronFlags, RealLaunchScriptsAreUnderstoodWhole) {
  // What each script still needs; every other flag it gives is implemented or accepted.
  const std::map<std::string, std::set<std::string>> expected = {
      {"megatron_gpt3_175b", {"--step-batch-size-schedule"}},
      {"megatron_llama3_8b_fp8", {}},
      {"megatron_mixtral_8x7b", {}},
      {"pai_qwen3_8b", {}},
      {"pai_qwen3_30b_a3b", {}},
      {"pai_deepseek_v3", {}},
  };
  for (const auto& [script, flags] : expected) {
    const std::string error = parse_error(script_args(script));
    EXPECT_EQ(error.find("unknown flag"), std::string::npos) << script << ": " << error;
    std::set<std::string> refused = not_yet(error);
    // The GPT-3 script expands its batch-size schedule unquoted, so the shell splits it into
    // words: Megatron's argparse rejects that too.
    if (error.find("--step-batch-size-schedule: expects exactly one value") != std::string::npos) refused.insert("--step-batch-size-schedule");
    EXPECT_EQ(refused, flags) << script << ": " << error;
  }
}

TEST(MegatronFlags, IgnoredFlagsAreAcceptedWithANotice) {
  Config c = parse_train_arguments({"--use-mcore-models", "--transformer-impl", "transformer_engine", "--num-workers", "8",
                                    "--ckpt-format", "torch_dist", "--logging-level", "20", "--no-masked-softmax-fusion"});
  ASSERT_EQ(c.flag_notices.size(), 6u);
  EXPECT_NE(c.flag_notices[0].find("--use-mcore-models has no effect here"), std::string::npos) << c.flag_notices[0];
  EXPECT_NE(c.flag_notices[3].find("--ckpt-format has no effect here"), std::string::npos) << c.flag_notices[3];
  EXPECT_NE(c.flag_notices[3].find("resharding format"), std::string::npos) << c.flag_notices[3];
}

TEST(MegatronFlags, UnimplementedFlagsPassOnlyWithMegatronsDefault) {
  // Megatron's defaults (--activation-offload-fraction 1, --fp4-recipe nvfp4) and the values that
  // are what megatron.cpp does (Pai's --dataset MMAP, --train-mode pretrain).
  Config c = parse_train_arguments({"--activation-offload-fraction", "1.0", "--fp4-recipe", "nvfp4",
                                    "--dataset", "MMAP", "--train-mode", "pretrain"});
  ASSERT_EQ(c.flag_notices.size(), 4u);
  EXPECT_NE(c.flag_notices[0].find("--activation-offload-fraction changes nothing"), std::string::npos) << c.flag_notices[0];
  EXPECT_NE(c.flag_notices[2].find("--dataset (a Pai-Megatron-Patch flag) changes nothing"), std::string::npos) << c.flag_notices[2];

  EXPECT_NE(parse_error({"--activation-offload-fraction", "0.5"}).find("--activation-offload-fraction is not implemented yet"),
            std::string::npos);
  EXPECT_NE(parse_error({"--checkpoint-activations"}).find("--checkpoint-activations is not implemented yet: use --recompute-granularity full"),
            std::string::npos);
  EXPECT_NE(parse_error({"--moe-topk", "2"}).find("--moe-topk (a Pai-Megatron-Patch flag) is not implemented yet: use --moe-router-topk"),
            std::string::npos);
  EXPECT_NE(parse_error({"--dataset", "JSON-SFT"}).find("--dataset (a Pai-Megatron-Patch flag) is not implemented yet"), std::string::npos);
  EXPECT_NE(parse_error({"--checkpoint-activations", "yes"}).find("--checkpoint-activations is a switch and takes no value (got 'yes')"),
            std::string::npos);
  EXPECT_NE(parse_error({"--activation-offload-fraction"}).find("--activation-offload-fraction expects one value"), std::string::npos);
}

TEST(MegatronFlags, EveryProblemIsReportedAtOnce) {
  const std::string error = parse_error({"--checkpoint-activations", "--num-layers", "two", "--frobnicate", "--apply-query-key-layer-scaling",
                                         "--use-flash-attn"});
  EXPECT_NE(error.find("4 problems with the flags:"), std::string::npos) << error;
  EXPECT_NE(error.find("\n  --checkpoint-activations is not implemented yet"), std::string::npos) << error;
  EXPECT_NE(error.find("\n  --num-layers: expected an integer, got 'two'"), std::string::npos) << error;
  EXPECT_NE(error.find("\n  unknown flag --frobnicate"), std::string::npos) << error;
  EXPECT_NE(error.find("\n  --apply-query-key-layer-scaling is not implemented yet"), std::string::npos) << error;
  EXPECT_EQ(error.find("use-flash-attn"), std::string::npos) << "accepted, not a problem\n" << error;
}

TEST(MegatronFlags, DidYouMeanDrawsOnEveryKnownFlag) {
  EXPECT_NE(parse_error({"--use-mcore-model"}).find("(did you mean --use-mcore-models?)"), std::string::npos);
  EXPECT_NE(parse_error({"--micro-batchsize", "1"}).find("(did you mean --micro-batch-size?)"), std::string::npos);
  EXPECT_NE(parse_error({"--decoupled-lrr", "1"}).find("(did you mean --decoupled-lr?)"), std::string::npos);
  EXPECT_NE(parse_error({"--train-sample", "1"}).find("(did you mean --train-samples?)"), std::string::npos);
  EXPECT_EQ(parse_error({"--xyzzy"}).find("did you mean"), std::string::npos) << parse_error({"--xyzzy"});
}

TEST(MegatronFlags, RecipeKeysAreJudgedTheSameWay) {
  test::TempDir dir;
  std::ofstream(dir / "recipe.yaml") << "num-layers: 2\nuse_flash_attn: true\ncheckpoint_activations: true\nfp8_margin: 0\n";
  const std::string error = parse_error({"--config", dir / "recipe.yaml"});
  EXPECT_NE(error.find("recipe.yaml:3: key 'checkpoint_activations': --checkpoint-activations is not implemented yet: use "
                       "--recompute-granularity full"),
            std::string::npos)
      << error;
  std::ofstream(dir / "fine.yaml") << "num-layers: 2\nuse_flash_attn: true\ncheckpoint_activations: false\n";
  Config c = parse_train_arguments({"--config", dir / "fine.yaml"});
  EXPECT_EQ(c.flag_notices.size(), 2u);
}

TEST(MegatronFlags, PaddedVocabSizeAndPatchTokenizerAreChecked) {
  auto finalized = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
                                     "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--vocab-size", "100"};
    args.insert(args.end(), extra.begin(), extra.end());
    Config c = parse_train_arguments(args);
    finalize_config(c, 2);
    return c;
  };
  EXPECT_EQ(finalized({}).model.padded_vocab_size, 128);
  EXPECT_EQ(finalized({"--padded-vocab-size", "150"}).model.padded_vocab_size, 150);
  auto error = [&](std::vector<std::string> extra) {
    try {
      finalized(extra);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error({"--padded-vocab-size", "99"}).find("--padded-vocab-size 99 must cover the 101 ids"), std::string::npos);
  EXPECT_NE(error({"--padded-vocab-size", "151", "--tensor-model-parallel-size", "2"}).find("a multiple of --tensor-model-parallel-size 2"),
            std::string::npos);
  EXPECT_NE(error({"--patch-tokenizer-type", "Qwen3Tokenizer"}).find("reads the tokenizer from --load, as Pai-Megatron-Patch does"),
            std::string::npos);
  EXPECT_NE(error({"--patch-tokenizer-type", "IcetkGLM130BTokenizer", "--load", "x"}).find("is not supported; supported:"),
            std::string::npos);
}

TEST(MegatronFlags, TableIsSortedAndApartFromTheImplementedFlags) {
  const auto& table = megatron_flags();
  ASSERT_GT(table.size(), 700u);  // shrinks as flags get implemented
  const std::string help = train_help();
  const std::string implemented = help.substr(0, help.find("\nMegatron flags accepted"));
  for (size_t i = 0; i < table.size(); ++i) {
    const MegatronFlag& f = table[i];
    if (i > 0) EXPECT_LT(std::strcmp(table[i - 1].name, f.name), 0) << f.name;
    EXPECT_EQ(find_megatron_flag(f.name), &f) << f.name;
    EXPECT_EQ(implemented.find(std::string("  --") + f.name + " "), std::string::npos) << f.name << " is implemented too";
    if (f.fate == MegatronFlag::Fate::Ignored) EXPECT_NE(f.note, nullptr) << f.name;
    if (f.arity == MegatronFlag::Arity::None) {
      ASSERT_NE(f.value_when_given, nullptr) << f.name;
      ASSERT_NE(f.megatron_default, nullptr) << f.name;
    }
  }
  EXPECT_NE(help.find("Megatron flags not implemented yet"), std::string::npos);
}

// `megatron pretrain_gpt.py ARGS` is `megatron train ARGS`: a launch line changes the program only.
TEST(MegatronFlags, RankZeroPrintsTheNoticesAndTheScriptNameStandsForTrain) {
  auto r = test::run_megatron({"examples/pretrain_gpt.py", "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
                               "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--tokenizer-type",
                               "NullTokenizer", "--vocab-size", "63", "--device", "cpu", "--cpu-threads", "1", "--eval-interval", "0",
                               "--use-flash-attn", "--use-mcore-models"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("> note: --use-flash-attn has no effect here: it picks a kernel"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> note: --use-mcore-models has no effect here"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("> note: pretrain_gpt.py runs as `megatron train`"), std::string::npos) << r.output;
  auto bare = test::run_megatron({"train"});
  EXPECT_EQ(bare.status, 2);
  EXPECT_NE(bare.output.find("usage: megatron train"), std::string::npos) << bare.output;
  auto bert = test::run_megatron({"pretrain_bert.py", "--num-layers", "1"});
  EXPECT_EQ(bert.status, 2);
  EXPECT_NE(bert.output.find("pretrain_bert.py is not a script megatron.cpp stands in for"), std::string::npos) << bert.output;
}

}  // namespace
}  // namespace megatron
