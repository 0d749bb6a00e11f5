// The safetensors format (huggingface/safetensors): u64 little-endian header length N, N bytes
// of JSON ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}),
// then the tensors' bytes, little-endian, C order, back to back.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace megatron {

struct SafetensorsEntry {
  std::string name;
  at::Tensor tensor;
};

// Writes `tensors` (any device; copied to CPU) to `path` atomically (temp name, fsync, rename),
// with the CRC-32 of the data section in the metadata ("crc32").
// "F32", "BF16", ...: the safetensors name of a dtype.
std::string safetensors_dtype_name(at::ScalarType type);

void save_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// A memory-mapped safetensors file. The header is fully validated on open (offsets inside the
// file, sizes matching shapes and dtypes, no overlaps); errors are UserErrors naming the file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // in file order
  bool contains(const std::string& name) const;
  // A CPU tensor viewing the mapping (valid while this object lives); UserError if absent.
  at::Tensor view(const std::string& name) const;
  // As view(), refusing a tensor stored in another kind of dtype: a weight or optimizer state
  // must be floating-point (F64/F32/F16/BF16/F8), or copying it into a parameter would convert
  // integer bits value by value and train on garbage without a word (a header's dtype edited
  // from F32 to I32 keeps every offset valid). UserError naming the file, tensor and dtype.
  at::Tensor view_floating(const std::string& name) const;
  // As view(), refusing any dtype but `dtype` (`what` says what the tensor is, for the error).
  at::Tensor view_exactly(const std::string& name, at::ScalarType dtype, const std::string& what) const;
  // An owned copy.
  at::Tensor load(const std::string& name) const { return view(name).clone(); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Recomputes the CRC-32 of the data section and compares it with the "crc32" metadata that
  // save_safetensors writes (files without one pass); UserError naming the file on a mismatch.
  void verify_checksum() const;

 private:
  struct Info {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    size_t begin, end;  // relative to the data section
  };
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  size_t data_start_ = 0;
  std::vector<std::string> order_;
  std::map<std::string, Info> infos_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace megatron
