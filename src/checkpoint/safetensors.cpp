#include "checkpoint/safetensors.h"

#include <zlib.h>

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/errors.h"
#include "core/files.h"
#include "core/json_text.h"

namespace megatron {
namespace {

const std::vector<std::pair<std::string, at::ScalarType>>& dtype_names() {
  static const std::vector<std::pair<std::string, at::ScalarType>> names = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
      {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
      {"U8", at::kByte},    {"BOOL", at::kBool},   {"F8_E4M3", at::kFloat8_e4m3fn}, {"F8_E5M2", at::kFloat8_e5m2}};
  return names;
}

}  // namespace

std::string safetensors_dtype_name(at::ScalarType t) {
  for (const auto& [name, type] : dtype_names()) {
    if (type == t) return name;
  }
  TORCH_CHECK(false, "safetensors: unsupported dtype ", t);
}

namespace {

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw UserError("writing " + path + " failed: " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

uint32_t crc32_of(uint32_t crc, const void* data, size_t bytes) {
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(bytes, 1u << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, chunk));
    p += chunk;
    bytes -= chunk;
  }
  return crc;
}

}  // namespace

void SafetensorsFile::verify_checksum() const {
  auto it = metadata_.find("crc32");
  if (it == metadata_.end()) return;  // written by another tool
  const uint32_t crc = crc32_of(0, static_cast<const char*>(map_) + data_start_, size_ - data_start_);
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%08x", crc);
  if (it->second != hex) {
    throw UserError(path_ + ": checksum mismatch (stored crc32 " + it->second + ", data has " + hex +
                    "): the file is corrupt; use an earlier checkpoint");
  }
}

void save_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::vector<at::Tensor> cpu;
  nlohmann::ordered_json entries = nlohmann::ordered_json::object();
  size_t offset = 0;
  uint32_t crc = 0;
  for (const auto& e : tensors) {
    at::Tensor t = e.tensor.detach().to(at::kCPU).contiguous();
    const size_t bytes = t.numel() * t.element_size();
    entries[e.name] = {{"dtype", safetensors_dtype_name(t.scalar_type())}, {"shape", t.sizes().vec()},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    crc = crc32_of(crc, t.data_ptr(), bytes);
    cpu.push_back(std::move(t));
  }
  // The data section's CRC-32 travels in the metadata, so a reader can tell a corrupt file.
  std::map<std::string, std::string> meta = metadata;
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%08x", crc);
  meta["crc32"] = hex;
  header["__metadata__"] = meta;
  for (auto& [name, info] : entries.items()) header[name] = info;
  std::string json = header.dump();
  json.resize((json.size() + 7) / 8 * 8, ' ');  // the data section starts 8-byte aligned
  const uint64_t n = json.size();

  const std::string tmp = temporary_name(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw UserError("cannot write " + tmp + ": " + std::strerror(errno));
  try {
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    write_all(fd, len, 8, tmp);
    write_all(fd, json.data(), json.size(), tmp);
    for (const auto& t : cpu) write_all(fd, t.data_ptr(), t.numel() * t.element_size(), tmp);
    if (::fsync(fd) != 0) throw UserError("fsync of " + tmp + " failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw UserError("cannot rename " + tmp + " to " + path + ": " + std::strerror(err));
  }
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw UserError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  size_ = static_cast<size_t>(st.st_size);
  auto fail = [&](const std::string& what) -> UserError {
    return UserError(path + ": not a valid safetensors file (" + what + "); it may be truncated or corrupt");
  };
  if (size_ < 8) {
    ::close(fd);
    throw fail("shorter than its 8-byte header length");
  }
  map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw UserError("cannot map " + path + ": " + std::strerror(errno));
  }
  try {
    const auto* bytes = static_cast<const unsigned char*>(map_);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(bytes[i]) << (8 * i);
    if (n > size_ - 8) throw fail("header length " + std::to_string(n) + " exceeds the file size");
    data_start_ = 8 + n;
    check_json_depth(std::string_view(reinterpret_cast<const char*>(bytes + 8), n), path + " (safetensors header)");
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(reinterpret_cast<const char*>(bytes + 8), reinterpret_cast<const char*>(bytes + 8 + n));
    } catch (const nlohmann::json::exception& e) {
      throw fail(std::string("header is not JSON: ") + e.what());
    }
    if (!header.is_object()) throw fail("header is not a JSON object");
    std::vector<std::pair<size_t, size_t>> ranges;
    const size_t data_size = size_ - data_start_;
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it.value().is_object()) throw fail("__metadata__ is not an object");
        for (auto m = it.value().begin(); m != it.value().end(); ++m) {
          if (!m.value().is_string()) throw fail("metadata values must be strings");
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      const auto& v = it.value();
      const std::string tensor = "tensor '" + it.key() + "'";
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
        throw fail("entry '" + it.key() + "' lacks dtype, shape or data_offsets");
      }
      if (!v["dtype"].is_string()) throw fail(tensor + ": dtype is not a string");
      if (!v["shape"].is_array()) throw fail(tensor + ": shape is not a list");
      if (!v["data_offsets"].is_array() || v["data_offsets"].size() != 2) throw fail(tensor + ": data_offsets is not a list of two");
      Info info{};
      const std::string dt = v["dtype"].get<std::string>();
      auto found = std::find_if(dtype_names().begin(), dtype_names().end(), [&](const auto& p) { return p.first == dt; });
      if (found == dtype_names().end()) throw fail(tensor + " has unsupported dtype " + dt);
      info.dtype = found->second;
      // Sizes in checked arithmetic: no product or sum may wrap around.
      uint64_t bytes = c10::elementSize(info.dtype);
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned()) throw fail(tensor + ": dimensions must be non-negative integers, got " + d.dump());
        const uint64_t dim = d.get<uint64_t>();
        if (dim > uint64_t(INT64_MAX) || (dim != 0 && bytes > uint64_t(INT64_MAX) / dim)) throw fail(tensor + ": shape too large");
        bytes *= dim;
        info.shape.push_back(int64_t(dim));
      }
      for (const auto& o : v["data_offsets"]) {
        if (!o.is_number_unsigned()) throw fail(tensor + ": data_offsets must be non-negative integers, got " + o.dump());
      }
      const uint64_t begin = v["data_offsets"][0].get<uint64_t>(), end = v["data_offsets"][1].get<uint64_t>();
      if (begin > end || end > data_size) {
        throw fail(tensor + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] outside the " +
                   std::to_string(data_size) + " bytes of data");
      }
      if (end - begin != bytes) throw fail(tensor + " byte range does not match its shape and dtype");
      info.begin = begin;
      info.end = end;
      ranges.emplace_back(info.begin, info.end);
      infos_[it.key()] = info;
    }
    // As the safetensors library requires: the tensors cover the data section exactly, back to
    // back, with no overlap, gap or trailing bytes (a header length off by one would otherwise
    // read every tensor shifted).
    std::sort(ranges.begin(), ranges.end());
    size_t covered = 0;
    for (const auto& [begin, end] : ranges) {
      if (begin < covered) throw fail("tensor byte ranges overlap");
      if (begin > covered) throw fail("bytes " + std::to_string(covered) + " to " + std::to_string(begin) + " of the data belong to no tensor");
      covered = end;
    }
    if (covered != data_size) {
      throw fail(std::to_string(data_size - covered) + " bytes after the last tensor belong to no tensor (the header length may be wrong)");
    }
    // File order = order of the data, which is what writers and readers expect to iterate.
    std::vector<std::pair<size_t, std::string>> by_offset;
    for (const auto& [name, info] : infos_) by_offset.emplace_back(info.begin, name);
    std::sort(by_offset.begin(), by_offset.end());
    for (auto& p : by_offset) order_.push_back(p.second);
  } catch (...) {
    ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

std::vector<std::string> SafetensorsFile::names() const { return order_; }

bool SafetensorsFile::contains(const std::string& name) const { return infos_.count(name) > 0; }

at::Tensor SafetensorsFile::view(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) throw UserError(path_ + ": has no tensor named '" + name + "'");
  const Info& info = it->second;
  void* data = static_cast<char*>(map_) + data_start_ + info.begin;
  return at::from_blob(data, info.shape, at::TensorOptions().dtype(info.dtype));
}

at::Tensor SafetensorsFile::view_floating(const std::string& name) const {
  const at::Tensor t = view(name);
  if (!at::isFloatingType(t.scalar_type())) {
    throw UserError(path_ + ": tensor '" + name + "' is stored as " + safetensors_dtype_name(t.scalar_type()) +
                    ", not a floating-point dtype (F32, BF16, F16, F64 or F8): the file is damaged or not of a model");
  }
  return t;
}

at::Tensor SafetensorsFile::view_exactly(const std::string& name, at::ScalarType dtype, const std::string& what) const {
  const at::Tensor t = view(name);
  if (t.scalar_type() != dtype) {
    throw UserError(path_ + ": tensor '" + name + "' is stored as " + safetensors_dtype_name(t.scalar_type()) + "; " + what +
                    " is " + safetensors_dtype_name(dtype) + ": the file is damaged");
  }
  return t;
}

}  // namespace megatron
