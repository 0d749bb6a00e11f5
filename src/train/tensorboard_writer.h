// TensorBoard event-file writer: owns one `events.out.tfevents.*` file under a log directory
// and appends scalar summaries to it in TFRecord framing. Hand-encodes the few protobuf
// messages it needs, so the trainer does not depend on protobuf or TensorFlow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace megatron {

// Exposed only so tests can check the checksum against known vectors.
namespace tensorboard_detail {

// CRC-32C (Castagnoli), as used by TFRecord framing.
uint32_t crc32c(const void* data, std::size_t size);

// TFRecord stores CRCs "masked" so that a CRC computed over data that itself contains
// CRCs does not degenerate; readers reject records whose masked CRC does not match.
uint32_t mask_crc32c(uint32_t crc);

}  // namespace tensorboard_detail

// Not thread-safe: call from the one rank/thread that logs.
class TensorBoardWriter {
 public:
  // Creates log_dir (and parents) and a new event file in it; throws UserError on failure.
  explicit TensorBoardWriter(const std::string& log_dir);
  ~TensorBoardWriter();

  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends one scalar and flushes, so TensorBoard sees it while training runs.
  void add_scalar(const std::string& tag, float value, int64_t step);
  void flush();

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace megatron
