// TensorBoard event-file writer. See tensorboard_writer.h.
//
// On-disk format (what TensorBoard's reader expects):
//   record  = uint64 LE length | uint32 LE masked crc32c(length bytes)
//             | payload | uint32 LE masked crc32c(payload)
//   payload = protobuf tensorflow.Event:
//     Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//               Summary summary = 5; }
//     Summary { repeated Value value = 1; }
//     Value   { string tag = 1; float simple_value = 2; }
#include "train/tensorboard_writer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/errors.h"

namespace megatron {
namespace {

struct Crc32cTable {
  uint32_t entries[256];
};

// Reflected CRC-32C table, built at compile time (0x82F63B78 is the reversed polynomial).
constexpr Crc32cTable make_crc32c_table() {
  Crc32cTable table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 1u) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    table.entries[i] = crc;
  }
  return table;
}

constexpr Crc32cTable kCrc32cTable = make_crc32c_table();

// Protobuf wire types used below.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

// Bytes are emitted one at a time so the file is little-endian regardless of the host.
void put_fixed32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_fixed64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (field << 3) | wire_type);
}

void put_bytes_field(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// Common Event prefix: wall_time and step.
std::string event_header(int64_t step) {
  const double wall_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  uint64_t wall_bits;
  std::memcpy(&wall_bits, &wall_time, sizeof(wall_bits));
  std::string event;
  put_key(event, 1, kFixed64);
  put_fixed64(event, wall_bits);
  put_key(event, 2, kVarint);
  // int64 (not sint64) encoding: negative steps become 10-byte varints, as in protobuf.
  put_varint(event, static_cast<uint64_t>(step));
  return event;
}

std::string scalar_event(const std::string& tag, float value, int64_t step) {
  uint32_t value_bits;
  std::memcpy(&value_bits, &value, sizeof(value_bits));
  std::string summary_value;
  put_bytes_field(summary_value, 1, tag);
  put_key(summary_value, 2, kFixed32);
  put_fixed32(summary_value, value_bits);

  std::string summary;
  put_bytes_field(summary, 1, summary_value);

  std::string event = event_header(step);
  put_bytes_field(event, 5, summary);
  return event;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

namespace tensorboard_detail {

uint32_t crc32c(const void* data, std::size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) {
    crc = kCrc32cTable.entries[(crc ^ bytes[i]) & 0xFF] ^ (crc >> 8);
  }
  return ~crc;
}

uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u; }

}  // namespace tensorboard_detail

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  if (ec) {
    throw UserError("cannot create TensorBoard log directory '" + log_dir +
                    "': " + ec.message() + "; check --tensorboard-dir");
  }

  // TensorBoard only picks up files whose name contains "tfevents"; the time/host/pid parts
  // keep concurrent or restarted runs sharing one directory from overwriting each other.
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  const std::string name = "events.out.tfevents." + std::to_string(seconds) + "." +
                           host_name() + "." + std::to_string(getpid()) + ".megatron";
  path_ = (std::filesystem::path(log_dir) / name).string();

  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) {
    throw UserError("cannot open TensorBoard event file in '" + log_dir +
                    "': " + std::strerror(errno) + "; check --tensorboard-dir");
  }

  // The reader identifies the format version from this first record.
  std::string event = event_header(0);
  put_bytes_field(event, 3, "brain.Event:2");
  write_record(event);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  // Every record was flushed when written, so fclose's result carries no news worth a throw
  // (and destructors must not throw).
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, float value, int64_t step) {
  write_record(scalar_event(tag, value, step));
  flush();
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0 || std::ferror(file_)) {
    throw UserError("cannot write TensorBoard event file '" + path_ +
                    "': " + std::strerror(errno) + "; check --tensorboard-dir");
  }
}

void TensorBoardWriter::write_record(const std::string& payload) {
  using tensorboard_detail::crc32c;
  using tensorboard_detail::mask_crc32c;
  std::string record;
  record.reserve(payload.size() + 16);
  put_fixed64(record, payload.size());
  put_fixed32(record, mask_crc32c(crc32c(record.data(), 8)));
  record += payload;
  put_fixed32(record, mask_crc32c(crc32c(payload.data(), payload.size())));
  // Errors surface in flush() via ferror, which stays set once any write fails.
  std::fwrite(record.data(), 1, record.size(), file_);
}

}  // namespace megatron
