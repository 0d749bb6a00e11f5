// End-to-end runs of `megatron train` on the tiny CPU recipe: the loss falls (fp32 and bf16),
// the same command gives bitwise-identical losses, a run stopped and resumed prints exactly
// the uninterrupted run's losses and ends with identical weights, SIGTERM saves and exits 0,
// SIGKILL during saves never leaves an unloadable checkpoint, and TensorBoard reads our events.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "data/indexed_dataset.h"
#include "support/test_support.h"

namespace megatron {
namespace {
namespace fs = std::filesystem;

std::vector<std::string> tiny(std::vector<std::string> extra) {
  // The CPU guarantees (bitwise determinism and resume) are what these runs check, on any machine.
  return test::tiny_cpu_train(extra);
}

using test::logged_losses;

using test::file_lines;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class LossFalls : public ::testing::TestWithParam<bool> {};

TEST_P(LossFalls, FiftyIterationsOnMockData) {
  std::vector<std::string> extra = {"--train-iters", "50", "--log-interval", "5"};
  if (GetParam()) extra.push_back("--bf16");
  auto run = test::run_megatron(tiny(extra));
  ASSERT_EQ(run.status, 0) << run.output;
  auto losses = logged_losses(run.output, 5);
  ASSERT_EQ(losses.size(), 10u) << run.output;
  EXPECT_NE(run.output.find(" iteration        1/      50 |"), std::string::npos) << "Megatron logs the first iteration too";
  EXPECT_GT(losses.front(), 5.0);
  EXPECT_LT(losses.back(), losses.front() - 2.5) << run.output;
  EXPECT_NE(run.output.find("validation loss at iteration 50"), std::string::npos);
  EXPECT_NE(run.output.find(" iteration       50/      50 | consumed samples:          400 |"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Precision, LossFalls, ::testing::Values(false, true));

TEST(TrainingRuns, SameCommandTwiceIsBitwiseIdentical) {
  test::TempDir dir;
  for (const char* name : {"a.jsonl", "b.jsonl"}) {
    auto run = test::run_megatron(tiny({"--train-iters", "8", "--hidden-dropout", "0.1", "--attention-dropout", "0.1",
                                        "--cpu-threads", "2", "--metrics-jsonl", dir / name}));
    ASSERT_EQ(run.status, 0) << run.output;
  }
  auto a = file_lines(dir / "a.jsonl"), b = file_lines(dir / "b.jsonl");
  ASSERT_EQ(a.size(), 8u);
  EXPECT_EQ(a, b);
}

class Resume : public ::testing::TestWithParam<bool> {};

// With --async-save (the parameter) the checkpoints are written by a thread from host copies
// while training continues, and must be the same.
TEST_P(Resume, EqualsUninterrupted) {
  test::TempDir dir;
  const std::vector<std::string> async = GetParam() ? std::vector<std::string>{"--async-save", "--save-interval", "2"}
                                                    : std::vector<std::string>{};
  // Dropout on, so resuming must restore the RNG state too; bf16 so the fp32 masters must be restored.
  const std::vector<std::string> common = {"--train-iters", "12", "--hidden-dropout", "0.1", "--attention-dropout",
                                           "0.1", "--bf16", "--log-interval", "1"};
  auto with = [&](std::vector<std::string> extra) {
    auto args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return tiny(args);
  };
  auto full = test::run_megatron(with({"--save", dir / "full", "--metrics-jsonl", dir / "full.jsonl"}));
  ASSERT_EQ(full.status, 0) << full.output;
  std::vector<std::string> first_args = {"--save", dir / "ckpt", "--exit-interval", "5", "--metrics-jsonl", dir / "resumed.jsonl"};
  first_args.insert(first_args.end(), async.begin(), async.end());
  auto first = test::run_megatron(with(first_args));
  ASSERT_EQ(first.status, 0) << first.output;
  if (GetParam()) {
    EXPECT_NE(first.output.find("started asynchronous checkpoint of iteration 2"), std::string::npos) << first.output;
    EXPECT_NE(first.output.find("saved checkpoint at iteration 4 to"), std::string::npos) << first.output;
  }
  EXPECT_EQ(file_bytes(dir / "ckpt/latest_checkpointed_iteration.txt"), "5\n");
  auto second = test::run_megatron(with({"--load", dir / "ckpt", "--save", dir / "ckpt", "--metrics-jsonl", dir / "resumed.jsonl"}));
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("loaded checkpoint"), std::string::npos);

  auto expected = file_lines(dir / "full.jsonl"), got = file_lines(dir / "resumed.jsonl");
  ASSERT_EQ(expected.size(), 12u);
  EXPECT_EQ(got, expected);
  // Identical weights and optimizer state at the end.
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    EXPECT_EQ(file_bytes(dir / (std::string("full/iter_0000012/") + file)),
              file_bytes(dir / (std::string("ckpt/iter_0000012/") + file)))
        << file;
  }
}

INSTANTIATE_TEST_SUITE_P(TrainingRuns, Resume, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "AsyncSave" : "SyncSave"; });

TEST(TrainingRuns, SigtermFinishesTheStepSavesAndExitsZero) {
  test::TempDir dir;
  std::string command = test::shell_quote(test::megatron_binary());
  for (const auto& a : tiny({"--train-iters", "100000", "--log-interval", "1", "--save", dir / "ckpt"})) {
    command += " " + test::shell_quote(a);
  }
  const std::string log = dir / "log";
  auto r = test::run_command("(" + command + " > " + log + " 2>&1 & pid=$!; for i in $(seq 600); do grep -q 'iteration' " +
                             log + " && break; sleep 0.1; done; kill -TERM $pid; wait $pid; echo status=$?)");
  EXPECT_NE(r.output.find("status=0"), std::string::npos) << r.output << file_bytes(log);
  EXPECT_NE(file_bytes(log).find("received signal 15"), std::string::npos) << file_bytes(log);
  const std::string latest = file_bytes(dir / "ckpt/latest_checkpointed_iteration.txt");
  ASSERT_FALSE(latest.empty());
  EXPECT_TRUE(fs::is_directory(dir / ("ckpt/iter_" + std::string(7 - (latest.size() - 1), '0') + latest.substr(0, latest.size() - 1))));
}

TEST(TrainingRuns, SigtermToOneRankStopsEveryRankAtTheSameIteration) {
  // Only rank 1 gets the signal (the launcher's newest child); rank 0 learns of it through the
  // stop poll, and both stop after the same iteration, save it together and exit 0.
  test::TempDir dir;
  std::string command = test::shell_quote(test::megatron_binary()) + " launch --nproc-per-node 2 --master-port 0";
  for (const auto& a : tiny({"--train-iters", "100000", "--log-interval", "1", "--save", dir / "ckpt"})) {
    command += " " + test::shell_quote(a);
  }
  const std::string log = dir / "log";
  auto r = test::run_command("(" + command + " > " + log + " 2>&1 & pid=$!; for i in $(seq 600); do grep -q 'iteration' " +
                             log + " && break; sleep 0.1; done; pkill -TERM -n -P $pid; wait $pid; echo status=$?)");
  const std::string output = file_bytes(log);
  EXPECT_NE(r.output.find("status=0"), std::string::npos) << r.output << output;
  std::regex stopped(R"(received signal 15: stopping after iteration (\d+))");
  std::vector<std::string> iterations;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), stopped); it != std::sregex_iterator(); ++it) {
    iterations.push_back((*it)[1]);
  }
  ASSERT_EQ(iterations.size(), 2u) << output;
  EXPECT_EQ(iterations[0], iterations[1]) << output;
  EXPECT_EQ(file_bytes(dir / "ckpt/latest_checkpointed_iteration.txt"), iterations[0] + "\n") << output;
}

TEST(TrainingRuns, ExitSignalPassedOnByTheLauncherSavesAndExitsZero) {
  // SLURM's --signal=USR1@120 reaches the launcher: it passes SIGUSR1 on, and a run started with
  // --exit-signal SIGUSR1 stops after the step as on SIGTERM, saving first.
  test::TempDir dir;
  std::string command = test::shell_quote(test::megatron_binary()) + " launch --nproc-per-node 1 --master-port 0";
  for (const auto& a : tiny({"--train-iters", "100000", "--log-interval", "1", "--save", dir / "ckpt", "--exit-signal", "SIGUSR1"})) {
    command += " " + test::shell_quote(a);
  }
  const std::string log = dir / "log";
  auto r = test::run_command("(" + command + " > " + log + " 2>&1 & pid=$!; for i in $(seq 600); do grep -q 'iteration' " +
                             log + " && break; sleep 0.1; done; kill -USR1 $pid; wait $pid; echo status=$?)");
  const std::string output = file_bytes(log);
  EXPECT_NE(r.output.find("status=0"), std::string::npos) << r.output << output;
  EXPECT_NE(output.find("launch: received SIGUSR1; passing it to all ranks"), std::string::npos) << output;
  std::smatch stopped;
  ASSERT_TRUE(std::regex_search(output, stopped, std::regex(R"(received signal 10: stopping after iteration (\d+))"))) << output;
  EXPECT_EQ(file_bytes(dir / "ckpt/latest_checkpointed_iteration.txt"), stopped[1].str() + "\n") << output;
  const auto bad = test::run_megatron(tiny({"--exit-signal", "SIGFOO"}));
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.output.find("--exit-signal SIGFOO: not a signal the run can stop on"), std::string::npos) << bad.output;
}

// --grad-reduce-in-bf16 over Gloo: DP=2 with the distributed optimizer, overlapped reduce-scatters
// of small buckets, two micro-batches accumulated per rank. The bf16 gradients must change the
// run (the log names them, the losses are not bit-identical) and stay within bf16 noise of the
// fp32 gradients' run.
TEST(TrainingRuns, GradReduceInBf16StaysWithinBf16NoiseOfFp32Gradients) {
  auto train = [](const std::vector<std::string>& extra) {
    std::string command = test::shell_quote(test::megatron_binary()) + " launch --nproc-per-node 2 --master-port 0";
    std::vector<std::string> flags = {"--bf16", "--train-iters", "20", "--log-interval", "1", "--eval-interval", "0",
                                      "--global-batch-size", "16", "--use-distributed-optimizer", "--overlap-grad-reduce",
                                      "--ddp-bucket-size", "20000", "--hidden-dropout", "0", "--attention-dropout", "0"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    for (const auto& a : tiny(flags)) command += " " + test::shell_quote(a);
    return test::run_command(command);
  };
  const auto fp32 = train({}), bf16 = train({"--grad-reduce-in-bf16"});
  ASSERT_EQ(fp32.status, 0) << fp32.output;
  ASSERT_EQ(bf16.status, 0) << bf16.output;
  EXPECT_NE(bf16.output.find("bf16 (fp32 master weights, bf16 gradients)"), std::string::npos) << bf16.output;
  const std::vector<double> want = logged_losses(fp32.output), got = logged_losses(bf16.output);
  ASSERT_EQ(want.size(), 20u) << fp32.output;
  ASSERT_EQ(got.size(), want.size()) << bf16.output;
  const double largest = test::largest_relative_difference(got, want);
  std::printf("largest relative loss difference, bf16 vs fp32 gradients: %.3e\n", largest);
  EXPECT_GT(largest, 0.0) << "bf16 gradients left every loss bit-identical: the flag did nothing";
  EXPECT_LE(largest, 2e-3) << bf16.output;  // 3e-5 seen on 2 cores
}

TEST(TrainingRuns, SigkillDuringSavesLeavesALoadableCheckpoint) {
  test::TempDir dir;
  std::string command = test::shell_quote(test::megatron_binary());
  // The schedule's length fixed apart from --train-iters, so a resume ending at any iteration is valid.
  const std::vector<std::string> schedule = {"--lr-decay-iters", "100000"};
  std::vector<std::string> run = schedule;
  run.insert(run.end(), {"--train-iters", "100000", "--save", dir / "ckpt", "--save-interval", "1", "--keep-last-n", "2"});
  for (const auto& a : tiny(run)) command += " " + test::shell_quote(a);
  const std::string tracker = dir / "ckpt/latest_checkpointed_iteration.txt";
  uint64_t lcg = 12345;
  for (int trial = 0; trial < 20; ++trial) {
    // Kill at a pseudo-random moment once the run saves (not by the clock from its start, which a
    // loaded machine stretches); saves (and deletions of older checkpoints, with --keep-last-n)
    // happen every iteration, so most kills land in one.
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    const std::string delay = std::to_string(0.5 * double(lcg >> 40) / double(1ULL << 24));
    const std::string saved = "[ -e " + test::shell_quote(tracker) + " ]";
    test::run_command("(" + command + " > /dev/null 2>&1 & pid=$!; for i in $(seq 1200); do " + saved +
                      " && break; sleep 0.05; done; sleep " + delay + "; kill -KILL $pid; wait $pid)");
    const std::string latest = file_bytes(tracker);
    ASSERT_FALSE(latest.empty()) << "trial " << trial;
    const int iteration = std::stoi(latest);
    std::vector<std::string> resume = schedule;
    resume.insert(resume.end(), {"--load", dir / "ckpt", "--train-iters", std::to_string(iteration + 1), "--log-interval", "1"});
    auto load = test::run_megatron(tiny(resume));
    ASSERT_EQ(load.status, 0) << "trial " << trial << ": " << load.output;
    EXPECT_NE(load.output.find("loaded checkpoint"), std::string::npos);
    for (const auto& entry : fs::directory_iterator(dir / "ckpt")) {
      const std::string name = entry.path().filename().string();
      if (name.find(".tmp-") == std::string::npos && entry.is_directory()) {
        EXPECT_TRUE(fs::exists(entry.path() / "state.json")) << "partial checkpoint under a final name: " << name;
      }
    }
  }
}

TEST(TrainingRuns, FlippedByteIsCaughtByTheChecksum) {
  test::TempDir dir;
  ASSERT_EQ(test::run_megatron(tiny({"--train-iters", "2", "--lr-warmup-iters", "1", "--save", dir / "ckpt"})).status, 0);
  const std::string optimizer = dir / "ckpt/iter_0000002/optimizer.safetensors";
  {
    std::fstream f(optimizer, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(optimizer) - 100));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(fs::file_size(optimizer) - 100));
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  auto load = test::run_megatron(tiny({"--train-iters", "3", "--lr-warmup-iters", "1", "--load", dir / "ckpt"}));
  EXPECT_EQ(load.status, 2);
  EXPECT_NE(load.output.find("error: " + optimizer + ": checksum mismatch"), std::string::npos) << load.output;
}

TEST(TrainingRuns, KeepLastNKeepsTheNewest) {
  test::TempDir dir;
  ASSERT_EQ(test::run_megatron(tiny({"--train-iters", "5", "--save", dir / "ckpt", "--save-interval", "1", "--keep-last-n", "2"})).status, 0);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir / "ckpt")) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"iter_0000004", "iter_0000005", "latest_checkpointed_iteration.txt"}));
}

TEST(TrainingRuns, CorruptCheckpointIsRefusedNamingTheFile) {
  test::TempDir dir;
  ASSERT_EQ(test::run_megatron(tiny({"--train-iters", "2", "--lr-warmup-iters", "1", "--save", dir / "ckpt"})).status, 0);
  const std::string model = dir / "ckpt/iter_0000002/model.safetensors";
  fs::resize_file(model, fs::file_size(model) / 2);
  auto load = test::run_megatron(tiny({"--train-iters", "3", "--lr-warmup-iters", "1", "--load", dir / "ckpt"}));
  EXPECT_EQ(load.status, 2);
  EXPECT_NE(load.output.find("error: " + model), std::string::npos) << load.output;
  EXPECT_NE(load.output.find("truncated or corrupt"), std::string::npos) << load.output;
}

// Megatron's tags, every iteration and against consumed samples (8 a step here), the last
// iterations after the last log interval too, and the values the log's exact losses say.
TEST(TrainingRuns, TensorBoardReadsTheEvents) {
  test::TempDir dir;
  auto run = test::run_megatron(tiny({"--train-iters", "7", "--log-interval", "2", "--eval-interval", "4", "--tensorboard-dir",
                                      dir / "tb", "--metrics-jsonl", dir / "m.jsonl"}));
  ASSERT_EQ(run.status, 0) << run.output;
  const std::string python = test::venv_python();
  ASSERT_FALSE(python.empty());
  auto read = test::run_command(test::shell_quote(python) + " " +
                                test::shell_quote(test::source_dir() + "/tests/train/read_tensorboard.py") + " " +
                                test::shell_quote(dir / "tb"));
  ASSERT_EQ(read.status, 0) << read.output;
  for (const char* line : {"lm loss 1 ", "lm loss 7 ", "lm loss vs samples 56 ", "learning-rate 3 ", "learning-rate vs samples 24 ",
                           "batch-size 5 8.0", "batch-size vs samples 40 8.0", "loss-scale 6 1.0", "loss-scale vs samples 48 1.0",
                           "grad-norm 2 ", "grad-norm vs samples 16 ", "lm loss validation 4 ", "lm loss validation vs samples 32 ",
                           "throughput (tokens/s/GPU) 6 "}) {
    EXPECT_NE(read.output.find(line), std::string::npos) << line << " missing in:\n" << read.output;
  }
  // Each iteration's "lm loss" is its exact loss from --metrics-jsonl, in fp32.
  const std::vector<std::string> jsonl = file_lines(dir / "m.jsonl");
  ASSERT_EQ(jsonl.size(), 7u);
  for (size_t i = 0; i < jsonl.size(); ++i) {
    const double exact = std::stod(jsonl[i].substr(jsonl[i].find("\"lm_loss\": ") + 11));
    const std::string tag = "\nlm loss " + std::to_string(i + 1) + " ";
    const size_t at = ("\n" + read.output).find(tag);
    ASSERT_NE(at, std::string::npos) << tag;
    EXPECT_FLOAT_EQ(std::stof(("\n" + read.output).substr(at + tag.size())), float(exact)) << "iteration " << i + 1;
  }
}

TEST(TrainingRuns, TrainsOnAnIndexedDatasetWithMegatronSampling) {
  test::TempDir dir;
  {
    // Documents of consecutive ids (learnable), ids below the NullTokenizer's vocabulary of 256.
    IndexedDatasetBuilder builder(dir / "corpus_text_document", TokenDType::kUInt16);
    for (int64_t d = 0; d < 400; ++d) {
      std::vector<int64_t> doc;
      for (int64_t k = 0; k < 20 + d % 37; ++k) doc.push_back((d * 7 + k) % 250);
      doc.push_back(255);  // end of document
      builder.add_document(doc.data(), doc.size());
    }
    builder.finalize();
  }
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{}, std::vector<std::string>{"--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"}}) {
    std::vector<std::string> args = {"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--cpu-threads", "1",
                                     "--device", "cpu", "--data-path", dir / "corpus_text_document", "--vocab-size", "255", "--split", "90,10,0",
                                     "--data-cache-path", dir / "cache", "--train-iters", "30", "--log-interval", "10",
                                     "--eval-interval", "30"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto run = test::run_megatron(args);
    ASSERT_EQ(run.status, 0) << run.output;
    auto losses = logged_losses(run.output, 10);
    ASSERT_EQ(losses.size(), 3u) << run.output;
    EXPECT_LT(losses.back(), losses.front() - 1.0) << run.output;
    EXPECT_NE(run.output.find("validation loss at iteration 30"), std::string::npos) << run.output;
  }
}

TEST(TrainingRuns, TokenIdsBeyondTheVocabularyAreAnError) {
  test::TempDir dir;
  {
    IndexedDatasetBuilder builder(dir / "big_ids", TokenDType::kInt32);
    std::vector<int64_t> doc(300, 5000);
    builder.add_document(doc.data(), doc.size());
    builder.finalize();
  }
  auto run = test::run_megatron({"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--data-path",
                                 dir / "big_ids", "--split", "1,0,0", "--data-cache-path", dir / "cache", "--train-iters", "6"});
  EXPECT_EQ(run.status, 2);
  EXPECT_NE(run.output.find("holds token id 5000, outside the model's vocabulary"), std::string::npos) << run.output;
}

// Without a CUDA device, asking for the captured step is a UserError naming the flag (on the GPU
// machine CudaParity.CudaGraphStepTrainsAsTheEagerStep trains with it).
TEST(TrainingRuns, CudaGraphWithoutACudaDeviceIsAnError) {
  if (at::hasCUDA()) GTEST_SKIP() << "this machine has a CUDA device";
  auto run = test::run_megatron({"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--mock-data",
                                 "--train-iters", "6", "--cuda-graph-impl", "local"});
  EXPECT_EQ(run.status, 2);
  EXPECT_NE(run.output.find("--cuda-graph-impl local"), std::string::npos) << run.output;
}

// The overlapped optimizer step needs a second CUDA stream; on the CPU the run says so and
// trains with the serial step (CudaParity.OverlappedOptimizerStepTrainsAsTheSerialStep on the GPU).
TEST(TrainingRuns, OverlappedOptimizerStepOnTheCpuSaysItIsSerial) {
  if (at::hasCUDA()) GTEST_SKIP() << "this machine has a CUDA device";
  auto run = test::run_megatron({"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--mock-data",
                                 "--train-iters", "6", "--overlap-optimizer-step"});
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("> optimizer step: not overlapped (--overlap-optimizer-step needs a CUDA device)"),
            std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace megatron
