// Tests for the TensorBoard event-file writer: CRC vectors, TFRecord framing read back in
// C++, and (the real check) TensorBoard's own reader parsing what we wrote.
#include "train/tensorboard_writer.h"

#include <gtest/gtest.h>

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "support/test_support.h"

namespace megatron {
namespace {

using tensorboard_detail::crc32c;
using tensorboard_detail::mask_crc32c;

uint32_t crc_of(const std::string& s) { return crc32c(s.data(), s.size()); }

// Directory entries through POSIX calls (as test::TempDir): std::filesystem calls made by the
// test binary crashed in the GPU machine's image (docs/performance.md).
std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> files;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return files;
  while (const dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") files.push_back(dir + "/" + name);
  }
  ::closedir(d);
  return files;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

uint64_t load_le(const std::string& bytes, size_t offset, int width) {
  uint64_t v = 0;
  for (int i = 0; i < width; ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  }
  return v;
}

// Splits a file into TFRecord payloads, checking both CRCs of every record.
std::vector<std::string> read_records(const std::string& data) {
  std::vector<std::string> payloads;
  size_t pos = 0;
  while (pos < data.size()) {
    EXPECT_GE(data.size() - pos, 12u) << "truncated record header at " << pos;
    if (data.size() - pos < 12) break;
    const uint64_t length = load_le(data, pos, 8);
    EXPECT_EQ(load_le(data, pos + 8, 4), mask_crc32c(crc32c(data.data() + pos, 8)))
        << "bad length crc at " << pos;
    pos += 12;
    EXPECT_GE(data.size() - pos, length + 4) << "truncated record payload at " << pos;
    if (data.size() - pos < length + 4) break;
    const std::string payload = data.substr(pos, length);
    EXPECT_EQ(load_le(data, pos + length, 4), mask_crc32c(crc_of(payload)))
        << "bad payload crc at " << pos;
    payloads.push_back(payload);
    pos += length + 4;
  }
  return payloads;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

using test::shell_quote;

std::string find_venv() {
  const std::string python = test::venv_python();  // <venv>/bin/python
  return python.empty() ? "" : python.substr(0, python.size() - std::string("/bin/python").size());
}

std::string find_source_dir() { return test::source_dir(); }

TEST(TensorBoardCrc32c, KnownVectors) {
  EXPECT_EQ(crc_of(""), 0x00000000u);
  EXPECT_EQ(crc_of("123456789"), 0xE3069283u);
  // RFC 3720 (iSCSI) appendix B.4 vectors.
  EXPECT_EQ(crc_of(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc_of(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(crc_of(ascending), 0x46DD794Eu);
  EXPECT_EQ(mask_crc32c(0), 0xA282EAD8u);
}

TEST(TensorBoardWriter, FramingAndCrcs) {
  test::TempDir dir;
  const std::string log_dir = dir / "nested/run";  // parents must be created too
  {
    TensorBoardWriter writer(log_dir);
    writer.add_scalar("lm loss", 2.5f, 1);
    writer.add_scalar("learning-rate", 3e-4f, 1);
    writer.add_scalar("lm loss", 2.25f, 2);
  }
  const auto files = event_files(log_dir);
  ASSERT_EQ(files.size(), 1u);
  const std::string name = files[0].substr(files[0].rfind('/') + 1);
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_TRUE(name.size() > 9 && name.substr(name.size() - 9) == ".megatron") << name;

  const auto records = read_records(read_all(files[0]));
  ASSERT_EQ(records.size(), 4u);
  EXPECT_TRUE(contains(records[0], "brain.Event:2"));
  EXPECT_TRUE(contains(records[1], "lm loss"));
  EXPECT_TRUE(contains(records[2], "learning-rate"));
  EXPECT_TRUE(contains(records[3], "lm loss"));
  // simple_value is field 2, fixed32: key byte 0x15 followed by the float's LE bytes.
  const float value = 2.25f;
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  std::string encoded = "\x15";
  for (int i = 0; i < 4; ++i) encoded.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  EXPECT_TRUE(contains(records[3], encoded));
}

TEST(TensorBoardWriter, UnusableDirectoryIsUserError) {
  test::TempDir dir;
  std::ofstream(dir / "file") << "not a directory";
  const std::string bad = dir / "file/run";
  try {
    TensorBoardWriter writer(bad);
    FAIL() << "expected UserError for " << bad;
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(contains(message, bad)) << message;
    EXPECT_TRUE(contains(message, "--tensorboard-dir")) << message;
  }
}

TEST(TensorBoardWriter, ReferenceReaderParsesOutput) {
  const std::string venv = find_venv();
  ASSERT_FALSE(venv.empty())
      << "no Python venv with tensorboard: set MEGATRON_VENV or create "
         "~/.cache/megatron.cpp/venv-*";
  const std::string source_dir = find_source_dir();
  ASSERT_FALSE(source_dir.empty())
      << "cannot find tests/train/read_tensorboard.py: define or export MEGATRON_SOURCE_DIR";

  // (tag, step, value): floats are widened to double exactly, as the reader reports them.
  using Scalar = std::tuple<std::string, int64_t, double>;
  std::vector<Scalar> expected;
  test::TempDir dir;
  {
    TensorBoardWriter writer(dir.path());
    for (int64_t step = 1; step <= 5; ++step) {
      const float loss = 10.0f / static_cast<float>(step) + 0.1f;
      const float lr = 1e-4f * static_cast<float>(step);
      writer.add_scalar("lm loss", loss, step);
      writer.add_scalar("learning-rate", lr, step);
      expected.emplace_back("lm loss", step, static_cast<double>(loss));
      expected.emplace_back("learning-rate", step, static_cast<double>(lr));
    }
  }

  const std::string command = shell_quote(venv + "/bin/python") + " " +
                              shell_quote(source_dir + "/tests/train/read_tensorboard.py") +
                              " " + shell_quote(dir.path());
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr) << "cannot run: " << command;
  std::string output;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) output.append(buf, n);
  const int status = pclose(pipe);
  ASSERT_EQ(status, 0) << "reader failed (see stderr above): " << command << "\n" << output;

  // Tags contain spaces, so take step and value from the right. repr() round-trips, so
  // the parsed double must equal the written float exactly.
  std::vector<Scalar> actual;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    const size_t value_at = line.rfind(' ');
    const size_t step_at =
        (value_at == std::string::npos || value_at == 0) ? std::string::npos
                                                         : line.rfind(' ', value_at - 1);
    ASSERT_NE(step_at, std::string::npos) << "malformed reader line: " << line;
    actual.emplace_back(line.substr(0, step_at),
                        std::stoll(line.substr(step_at + 1, value_at - step_at - 1)),
                        std::strtod(line.c_str() + value_at + 1, nullptr));
  }
  std::sort(expected.begin(), expected.end());
  std::sort(actual.begin(), actual.end());
  EXPECT_EQ(actual, expected) << "reader output:\n" << output;
}

}  // namespace
}  // namespace megatron
