// The .npy files the dataset index caches live in: written exactly as numpy.save writes them (so
// the caches open in numpy, and compare byte for byte with Megatron's own caches), read back
// through a read-only memory map so every rank of a node shares one copy in the page cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace megatron {

// The element types Megatron's index arrays use.
enum class NpyDType { kInt16, kInt32, kUInt32, kInt64 };

size_t npy_itemsize(NpyDType dtype);
const char* npy_descr(NpyDType dtype);  // "<i4" etc.

// A read-only C-ordered array of one of the dtypes above: memory-mapped from a file, or owned.
class NpyArray {
 public:
  NpyArray() = default;
  // Takes the bytes of an in-memory array (shape's product elements of dtype).
  NpyArray(NpyDType dtype, std::vector<size_t> shape, std::vector<unsigned char> bytes);
  // Maps `path`; throws std::runtime_error saying what is wrong if it is not a little-endian,
  // C-ordered .npy of one of the dtypes above whose size matches its header.
  static NpyArray map_file(const std::string& path);

  NpyDType dtype() const { return dtype_; }
  const std::vector<size_t>& shape() const { return shape_; }
  size_t size() const { return size_; }  // elements
  const unsigned char* bytes() const { return data_; }

  // Element i of the flattened array, widened to int64.
  int64_t operator[](size_t i) const {
    switch (dtype_) {
      case NpyDType::kInt16: return load<int16_t>(i);
      case NpyDType::kInt32: return load<int32_t>(i);
      case NpyDType::kUInt32: return load<uint32_t>(i);
      case NpyDType::kInt64: return load<int64_t>(i);
    }
    return 0;
  }

 private:
  template <typename T>
  int64_t load(size_t i) const {
    // The data starts 64-byte aligned in a file numpy wrote, but a foreign file need not be.
    T v;
    __builtin_memcpy(&v, data_ + i * sizeof(T), sizeof(T));
    return static_cast<int64_t>(v);
  }

  NpyDType dtype_ = NpyDType::kInt64;
  std::vector<size_t> shape_;
  size_t size_ = 0;
  std::shared_ptr<const void> storage_;  // the mapping or the owned bytes
  const unsigned char* data_ = nullptr;
};

// numpy.save's bytes for an array: format 1.0 header, padded to 64 bytes like numpy's.
std::vector<unsigned char> npy_header(NpyDType dtype, const std::vector<size_t>& shape);

void write_npy_atomic(const std::string& path, NpyDType dtype, const std::vector<size_t>& shape, const void* data);

}  // namespace megatron
