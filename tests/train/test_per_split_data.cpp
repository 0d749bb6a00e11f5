// Megatron's --train-data-path / --valid-data-path / --test-data-path in a training run: the
// training split is its dataset whole (the same samples as --data-path with --split 100,0,0),
// validation reads its own data, and contradicting data flags are refused by name. Which samples
// each split holds is checked against megatron-core in tests/data/test_gpt_dataset.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/indexed_dataset.h"
#include "support/test_support.h"

namespace megatron {
namespace {

// Documents of ids below the tiny model's vocabulary, each ended by 255; `shift` makes another corpus.
void write_corpus(const std::string& prefix, int64_t shift) {
  IndexedDatasetBuilder builder(prefix, TokenDType::kUInt16);
  for (int64_t d = 0; d < 120; ++d) {
    std::vector<int64_t> doc;
    for (int64_t k = 0; k < 20 + d % 29; ++k) doc.push_back((d * 7 + k * (1 + shift)) % 250);
    doc.push_back(255);
    builder.add_document(doc.data(), doc.size());
  }
  builder.finalize();
}

std::vector<std::string> args(const test::TempDir& dir, std::vector<std::string> data) {
  std::vector<std::string> a = {"train", "--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--cpu-threads", "1", "--device",
                                "cpu", "--vocab-size", "256", "--train-iters", "3", "--lr-warmup-iters", "1", "--log-interval", "1",
                                "--eval-interval", "3", "--eval-iters", "1", "--data-cache-path", dir / "cache"};
  a.insert(a.end(), data.begin(), data.end());
  return a;
}

double validation_loss(const std::string& output) {
  const std::string key = "validation loss at iteration 3";
  const size_t at = output.find(key);
  if (at == std::string::npos) return -1;
  const size_t value = output.find("lm loss value: ", at);
  return value == std::string::npos ? -1 : std::stod(output.substr(value + 15));
}

TEST(PerSplitData, EachSplitReadsItsOwnDataWhole) {
  test::TempDir dir;
  write_corpus(dir / "train_text", 0);
  write_corpus(dir / "valid_text", 1);
  write_corpus(dir / "other_text", 2);

  const auto own = test::run_megatron(args(dir, {"--train-data-path", dir / "train_text", "--valid-data-path", dir / "valid_text"}));
  ASSERT_EQ(own.status, 0) << own.output;
  const auto cut = test::run_megatron(args(dir, {"--data-path", dir / "train_text", "--split", "100,0,0"}));
  ASSERT_EQ(cut.status, 0) << cut.output;
  const auto losses = test::logged_losses(own.output, 1);
  ASSERT_EQ(losses.size(), 3u) << own.output;
  EXPECT_EQ(losses, test::logged_losses(cut.output, 1)) << "the training split is the whole dataset\n" << own.output;
  const double valid = validation_loss(own.output);
  EXPECT_GT(valid, 0) << own.output;
  EXPECT_EQ(validation_loss(cut.output), -1) << "--split 100,0,0 leaves nothing to validate on\n" << cut.output;

  const auto other = test::run_megatron(args(dir, {"--train-data-path", dir / "train_text", "--valid-data-path", dir / "other_text"}));
  ASSERT_EQ(other.status, 0) << other.output;
  EXPECT_EQ(test::logged_losses(other.output, 1), losses);
  EXPECT_NE(validation_loss(other.output), valid) << "validation reads --valid-data-path\n" << other.output;

  auto refused = [&](std::vector<std::string> data, const std::string& message) {
    const auto r = test::run_megatron(args(dir, data));
    EXPECT_EQ(r.status, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  };
  refused({"--train-data-path", dir / "train_text", "--split", "90,10,0"}, "--split cuts --data-path into splits");
  refused({"--train-data-path", dir / "train_text", "--data-path", dir / "train_text"},
          "three sources of data: pass one of them (given: --data-path, per-split paths)");
  refused({"--valid-data-path", dir / "valid_text"}, "no training samples: pass --train-data-path");
  refused({"--train-data-path", "0", dir / "train_text", "1", dir / "valid_text"}, "--train-data-path: weight '0'");
}

}  // namespace
}  // namespace megatron
