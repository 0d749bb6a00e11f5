// .npy writing (numpy.save's exact bytes) and memory-mapped reading; see npy_file.h.
#include "data/npy_file.h"

#include "core/files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <stdexcept>

namespace megatron {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kAlign = 64;  // numpy's ARRAY_ALIGN
constexpr size_t kGrowthAxisMaxDigits = 21;

std::string os_error(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

std::string shape_repr(const std::vector<size_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

bool parse_dtype(const std::string& descr, NpyDType* out) {
  for (NpyDType d : {NpyDType::kInt16, NpyDType::kInt32, NpyDType::kUInt32, NpyDType::kInt64}) {
    if (descr == npy_descr(d)) {
      *out = d;
      return true;
    }
  }
  return false;
}

// The value text after 'key': in numpy's header dict.
std::string header_value(const std::string& header, const std::string& key) {
  const size_t at = header.find("'" + key + "':");
  if (at == std::string::npos) return "";
  size_t p = at + key.size() + 3;
  while (p < header.size() && header[p] == ' ') ++p;
  const size_t end = header.find_first_of(header[p] == '(' ? ")" : ",}", p);
  if (end == std::string::npos) return "";
  return header.substr(p, end - p + (header[p] == '(' ? 1 : 0));
}

}  // namespace

size_t npy_itemsize(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kInt16: return 2;
    case NpyDType::kInt32: return 4;
    case NpyDType::kUInt32: return 4;
    case NpyDType::kInt64: return 8;
  }
  return 8;
}

const char* npy_descr(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kInt16: return "<i2";
    case NpyDType::kInt32: return "<i4";
    case NpyDType::kUInt32: return "<u4";
    case NpyDType::kInt64: return "<i8";
  }
  return "?";
}

NpyArray::NpyArray(NpyDType dtype, std::vector<size_t> shape, std::vector<unsigned char> bytes)
    : dtype_(dtype), shape_(std::move(shape)) {
  size_ = 1;
  for (size_t d : shape_) size_ *= d;
  if (bytes.size() != size_ * npy_itemsize(dtype_)) throw std::logic_error("NpyArray: byte count does not match shape");
  auto owned = std::make_shared<std::vector<unsigned char>>(std::move(bytes));
  data_ = owned->data();
  storage_ = owned;
}

NpyArray NpyArray::map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(os_error("cannot open", path));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string msg = os_error("cannot stat", path);
    ::close(fd);
    throw std::runtime_error(msg);
  }
  const size_t file_size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (file_size > 0) {
    map = ::mmap(nullptr, file_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      const std::string msg = os_error("cannot map", path);
      ::close(fd);
      throw std::runtime_error(msg);
    }
  }
  ::close(fd);
  NpyArray a;
  a.storage_ = std::shared_ptr<const void>(map, [file_size](const void* p) {
    if (p != nullptr) ::munmap(const_cast<void*>(p), file_size);
  });
  const auto* bytes = static_cast<const unsigned char*>(map);
  auto fail = [&](const std::string& why) { throw std::runtime_error(path + ": not a valid index array (" + why + ")"); };
  if (file_size < kMagicLen + 4 || std::memcmp(bytes, kMagic, kMagicLen) != 0) fail("no .npy magic");
  const int major = bytes[6];
  size_t header_len = 0, prefix = 0;
  if (major == 1) {
    header_len = bytes[8] | (size_t{bytes[9]} << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (file_size < 12) fail("truncated header");
    header_len = bytes[8] | (size_t{bytes[9]} << 8) | (size_t{bytes[10]} << 16) | (size_t{bytes[11]} << 24);
    prefix = 12;
  } else {
    fail("unknown .npy version " + std::to_string(major));
  }
  if (prefix + header_len > file_size) fail("truncated header");
  const std::string header(reinterpret_cast<const char*>(bytes + prefix), header_len);
  std::string descr = header_value(header, "descr");
  if (descr.size() >= 2 && descr.front() == '\'' && descr.back() == '\'') descr = descr.substr(1, descr.size() - 2);
  if (!parse_dtype(descr, &a.dtype_)) fail("unsupported dtype '" + descr + "'");
  if (header_value(header, "fortran_order") != "False") fail("not C-ordered");
  const std::string shape = header_value(header, "shape");
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') fail("unreadable shape");
  a.size_ = 1;
  for (size_t p = 1; p + 1 < shape.size();) {
    while (p + 1 < shape.size() && (shape[p] == ' ' || shape[p] == ',')) ++p;
    if (p + 1 >= shape.size()) break;
    size_t dim = 0, digits = 0;
    while (p + 1 < shape.size() && shape[p] >= '0' && shape[p] <= '9') {
      dim = dim * 10 + static_cast<size_t>(shape[p++] - '0');
      ++digits;
    }
    if (digits == 0 || digits > 18) fail("unreadable shape " + shape);
    a.shape_.push_back(dim);
    a.size_ *= dim;
  }
  const size_t data_offset = prefix + header_len;
  if (file_size - data_offset != a.size_ * npy_itemsize(a.dtype_)) {
    fail("holds " + std::to_string(file_size - data_offset) + " data bytes, its header says " +
         std::to_string(a.size_ * npy_itemsize(a.dtype_)) + "; truncated?");
  }
  a.data_ = bytes + data_offset;
  return a;
}

std::vector<unsigned char> npy_header(NpyDType dtype, const std::vector<size_t>& shape) {
  std::string dict = std::string("{'descr': '") + npy_descr(dtype) + "', 'fortran_order': False, 'shape': " +
                     shape_repr(shape) + ", }";
  // numpy leaves room to grow the first axis in place.
  if (!shape.empty()) dict += std::string(kGrowthAxisMaxDigits - std::to_string(shape[0]).size(), ' ');
  const size_t pad = kAlign - ((kMagicLen + 2 + 2 + dict.size() + 1) % kAlign);
  dict += std::string(pad, ' ') + "\n";
  std::vector<unsigned char> out(kMagic, kMagic + kMagicLen);
  out.push_back(1);
  out.push_back(0);
  out.push_back(static_cast<unsigned char>(dict.size() & 0xff));
  out.push_back(static_cast<unsigned char>(dict.size() >> 8));
  out.insert(out.end(), dict.begin(), dict.end());
  return out;
}

void write_npy_atomic(const std::string& path, NpyDType dtype, const std::vector<size_t>& shape, const void* data) {
  size_t n = 1;
  for (size_t d : shape) n *= d;
  const std::vector<unsigned char> head = npy_header(dtype, shape);
  write_file_atomic(path, {std::string_view(reinterpret_cast<const char*>(head.data()), head.size()),
                           std::string_view(static_cast<const char*>(data), n * npy_itemsize(dtype))});
}

}  // namespace megatron
