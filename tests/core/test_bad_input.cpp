// Bad input gets an error naming the file or flag, never a crash and never silent garbage
// (issue #26's classes, the ones fixed so far): JSON nested deep enough to overflow the parser's
// stack; safetensors headers with wrong JSON types, offsets that wrap around 2^64, gaps, trailing
// bytes or a header length off by one (which would read every tensor shifted); NaN, infinite and
// out-of-range flag values that used to train with every step NaN or overflow a clock.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "core/errors.h"
#include "core/json_text.h"
#include "support/test_support.h"
#include "support/user_error.h"
#include "tokenizer/tokenizer.h"
#include "train/arguments.h"

namespace megatron {
namespace {

using test::user_error_of;

TEST(BadInput, JsonNestedBeyondTheBoundIsAnErrorNotAStackOverflow) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_NE(user_error_of([&] { parse_json_text(deep, "x.json"); }).find("x.json: JSON nested deeper than 512 levels"), std::string::npos);
  // Brackets inside strings (escaped quotes too) do not count; a legal depth parses.
  const std::string in_string = "{\"a\": \"" + std::string(2000, '[') + "\\\"" + std::string(2000, '{') + "\", \"b\": " +
                                std::string(100, '[') + std::string(100, ']') + "}";
  EXPECT_EQ(parse_json_text(in_string, "y.json")["a"].get<std::string>().size(), 4001u);
  EXPECT_NE(user_error_of([&] { parse_json_text("{\"a\": ", "z.json"); }).find("z.json: not valid JSON"), std::string::npos);

  // Through the loaders: a tokenizer.json and a safetensors header nested that deep.
  test::TempDir dir;
  {
    std::ofstream(dir / "tokenizer.json") << deep;
  }
  const std::string tokenizer_error = user_error_of([&] { make_tokenizer("HuggingFaceTokenizer", dir.path(), "", "", 0); });
  EXPECT_NE(tokenizer_error.find("tokenizer.json: JSON nested deeper"), std::string::npos) << tokenizer_error;
  {
    std::ofstream out(dir / "deep.safetensors", std::ios::binary);
    const uint64_t n = deep.size();
    for (int i = 0; i < 8; ++i) out.put(char(n >> (8 * i)));
    out << deep;
  }
  EXPECT_NE(user_error_of([&] { SafetensorsFile f(dir / "deep.safetensors"); }).find("deep.safetensors (safetensors header): JSON nested deeper"),
            std::string::npos);
}

// A valid two-tensor file, then the header rewritten (and the data cut or padded) by `edit`.
class CraftedSafetensors {
 public:
  CraftedSafetensors() {
    save_safetensors(dir_ / "good.safetensors", {{"a", at::arange(6, at::kFloat).reshape({2, 3})}, {"b", at::ones({4}, at::kBFloat16)}});
    std::ifstream in(dir_ / "good.safetensors", std::ios::binary);
    bytes_.assign(std::istreambuf_iterator<char>(in), {});
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes_[i])) << (8 * i);
    header_ = nlohmann::json::parse(bytes_.substr(8, n));
    data_ = bytes_.substr(8 + n);
  }
  // The error opening a file with this header and data ("" if it opens).
  std::string open(const nlohmann::json& header, const std::string& data, int64_t length_delta = 0, const std::string& padding = "") {
    const std::string json = header.dump() + padding;
    std::string file;
    const uint64_t n = uint64_t(int64_t(json.size()) + length_delta);
    for (int i = 0; i < 8; ++i) file.push_back(char(n >> (8 * i)));
    file += json + data;
    const std::string path = dir_ / "crafted.safetensors";
    std::ofstream(path, std::ios::binary) << file;
    return user_error_of([&] { SafetensorsFile f(path); });
  }
  nlohmann::json header_;
  std::string data_;

 private:
  test::TempDir dir_;
  std::string bytes_;
};

TEST(BadInput, SafetensorsHeadersAreCheckedFieldByField) {
  CraftedSafetensors c;
  EXPECT_EQ(c.open(c.header_, c.data_), "");  // the unedited file opens
  auto expect = [&](nlohmann::json header, const std::string& data, const std::string& want, int64_t delta = 0,
                    const std::string& padding = "") {
    const std::string error = c.open(header, data, delta, padding);
    EXPECT_NE(error.find("crafted.safetensors: not a valid safetensors file"), std::string::npos) << error;
    EXPECT_NE(error.find(want), std::string::npos) << error;
  };
  nlohmann::json h = c.header_;
  h["a"]["data_offsets"] = {0, 18446744073709551600ull};  // wraps around 2^64 when added to the data's start
  expect(h, c.data_, "outside the 32 bytes of data");
  h = c.header_;
  h["a"]["dtype"] = 7;
  expect(h, c.data_, "tensor 'a': dtype is not a string");
  h = c.header_;
  h["a"]["shape"] = {2, -3};
  expect(h, c.data_, "dimensions must be non-negative integers");
  h = c.header_;
  h["b"]["shape"] = {4611686018427387904ll, 4};  // bytes overflow 64 bits
  expect(h, c.data_, "shape too large");
  h = c.header_;
  h["a"]["data_offsets"] = "0-24";
  expect(h, c.data_, "data_offsets is not a list of two");
  h = c.header_;
  h["__metadata__"] = {{"crc32", 5}};
  expect(h, c.data_, "metadata values must be strings");
  // Trailing bytes, and a gap between the tensors.
  expect(c.header_, c.data_ + std::string(4, '\0'), "4 bytes after the last tensor belong to no tensor");
  h = c.header_;
  h["b"]["data_offsets"] = {28, 36};
  expect(h, c.data_ + std::string(4, '\0'), "bytes 24 to 28 of the data belong to no tensor");
  // A header length one short: the JSON loses its closing brace, or, with the spaces writers pad
  // it with, the data starts a byte early and every tensor would be read shifted; one long: the
  // first data byte joins the header.
  expect(c.header_, c.data_, "header is not JSON", -1);
  expect(c.header_, c.data_, "1 bytes after the last tensor belong to no tensor", -1, "  ");
  expect(c.header_, c.data_, "", +1);
}

// The numbers of every floating-point flag must be finite; ranges the training would otherwise
// turn into NaN steps, overflowing clocks or internal errors are named.
TEST(BadInput, FlagValuesOutOfRangeNameTheFlag) {
  auto error = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--config", test::source_dir() + "/examples/tiny_cpu.yaml", "--mock-data", "--device", "cpu",
                                     "--train-iters", "2", "--lr-warmup-iters", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    return user_error_of([&] {
      Config c = parse_train_arguments(args);
      finalize_config(c, 1);
    });
  };
  EXPECT_EQ(error({}), "");
  EXPECT_NE(error({"--hidden-dropout", "nan"}).find("--hidden-dropout: expected a finite number, got 'nan'"), std::string::npos);
  EXPECT_NE(error({"--lr", "inf"}).find("--lr: expected a finite number"), std::string::npos);
  EXPECT_NE(error({"--lr", "NaN"}).find("--lr: expected a finite number"), std::string::npos);
  EXPECT_NE(error({"--norm-epsilon", "-1"}).find("--norm-epsilon must be > 0"), std::string::npos);
  EXPECT_NE(error({"--rotary-base", "0"}).find("--rotary-base must be > 0"), std::string::npos);
  EXPECT_NE(error({"--global-batch-size", "-4"}).find("--global-batch-size must be positive"), std::string::npos);
  EXPECT_NE(error({"--distributed-timeout-minutes", "1e300"}).find("--distributed-timeout-minutes must be positive and at most"),
            std::string::npos);
  EXPECT_NE(error({"--adam-eps", "0"}).find("--adam-eps must be > 0"), std::string::npos);
  EXPECT_NE(error({"--weight-decay", "-0.1"}).find("--weight-decay must be >= 0"), std::string::npos);
  EXPECT_NE(error({"--cpu-threads", "2147483647"}).find("--cpu-threads must be from 0 (one per core) to 1024, got 2147483647"),
            std::string::npos);

  const auto launch = test::run_megatron({"launch", "--nproc-per-node", "1", "--kill-timeout", "1e12", "_print-env"});
  EXPECT_EQ(launch.status, 2) << launch.output;
  EXPECT_NE(launch.output.find("--kill-timeout expects a number of seconds from 0 to 86400, got '1e12'"), std::string::npos) << launch.output;
}

// A model no machine holds (a 128 TB attention projection) is an error naming the sizes, not an
// abort: libc10 throws on a failed allocation only while libsentencepiece is kept from
// overwriting its globals (tokenizer/sentencepiece_shim.cpp), and the trainer names the flags.
TEST(BadInput, ModelTooLargeForAnyMachineIsAnErrorNamingTheFlags) {
  const auto r = test::run_megatron(test::tiny_cpu_train({"--train-iters", "1", "--lr-warmup-iters", "0", "--hidden-size", "4194304"}));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("error: allocating the model (--num-layers 2, --hidden-size 4194304, --ffn-hidden-size 176, padded vocabulary "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("out of memory"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace megatron
