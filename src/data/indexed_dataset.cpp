// Megatron indexed dataset (.bin/.idx): validating mmap reader, streaming builder and merge.
// See indexed_dataset.h for the format. Only the standard library and POSIX are used.
#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <stdexcept>
#include <utility>

#include "core/errors.h"

namespace megatron {
namespace {

constexpr unsigned char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr uint64_t kVersion = 1;
constexpr size_t kHeaderSize = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype, S, D = 34
constexpr size_t kBufferBytes = size_t{1} << 20;   // builder write buffer
constexpr size_t kCopyChunkBytes = size_t{16} << 20;

std::string errno_text(int err) { return std::string(std::strerror(err)); }

template <typename T>
T load(const unsigned char* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// Writes all n bytes or throws; a short write here usually means the disk is full.
void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t written = ::write(fd, p, n);
    if (written < 0) {
      if (errno == EINTR) continue;
      throw UserError(path + ": write failed: " + errno_text(errno) +
                      "; check free disk space and permissions");
    }
    p += written;
    n -= static_cast<size_t>(written);
  }
}

void fsync_or_throw(int fd, const std::string& path) {
  if (::fsync(fd) != 0) {
    throw UserError(path + ": fsync failed: " + errno_text(errno) + "; check the output device");
  }
}

// Makes the renames durable. Best effort: some filesystems refuse fsync on a directory.
void fsync_parent_dir(const std::string& path) {
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    throw UserError("cannot rename " + from + " to " + to + ": " + errno_text(errno) +
                    "; check that the output directory is writable");
  }
}

// Opens a dataset file read-only and maps it whole; returns nullptr for an empty file (mmap
// rejects length 0). The descriptor is closed right away: the mapping stays valid without it,
// which keeps merges of many inputs under the fd limit.
UserError file_not_found(const std::string& path) {
  return UserError(path + ": file not found; a dataset prefix needs both <prefix>.bin and "
                   "<prefix>.idx (check the data path, or run the preprocessing step)");
}

const unsigned char* map_file(const std::string& path, size_t* size_out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) throw file_not_found(path);
    throw UserError(path + ": cannot open: " + errno_text(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw UserError(path + ": cannot stat: " + errno_text(err));
  }
  size_t size = static_cast<size_t>(st.st_size);
  *size_out = size;
  if (size == 0) {
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw UserError(path + ": mmap failed: " + errno_text(err));
  return static_cast<const unsigned char*>(p);
}

template <typename T>
void widen(const unsigned char* src, size_t count, int64_t* out) {
  // .bin is page-aligned and every sequence offset is a multiple of sizeof(T), so src is aligned.
  const T* typed = reinterpret_cast<const T*>(src);
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<int64_t>(typed[i]);
}

template <typename T>
bool fits(int64_t v) {
  return v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
         v <= static_cast<int64_t>(std::numeric_limits<T>::max());
}

}  // namespace

size_t token_dtype_itemsize(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8:
    case TokenDType::kInt8: return 1;
    case TokenDType::kInt16:
    case TokenDType::kUInt16: return 2;
    case TokenDType::kInt32:
    case TokenDType::kFloat32: return 4;
    case TokenDType::kInt64:
    case TokenDType::kFloat64: return 8;
  }
  throw std::invalid_argument("token_dtype_itemsize: invalid TokenDType " +
                              std::to_string(static_cast<int>(dtype)));
}

const char* token_dtype_name(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8: return "uint8";
    case TokenDType::kInt8: return "int8";
    case TokenDType::kInt16: return "int16";
    case TokenDType::kInt32: return "int32";
    case TokenDType::kInt64: return "int64";
    case TokenDType::kFloat64: return "float64";
    case TokenDType::kFloat32: return "float32";
    case TokenDType::kUInt16: return "uint16";
  }
  return "invalid";
}

bool token_dtype_is_integer(TokenDType dtype) {
  return dtype != TokenDType::kFloat32 && dtype != TokenDType::kFloat64;
}

TokenDType token_dtype_for_vocab(int64_t vocab_size) {
  // Same threshold as Megatron's DType.optimal_dtype (not 65536: Megatron leaves headroom).
  return vocab_size < 65500 ? TokenDType::kUInt16 : TokenDType::kInt32;
}

// ----------------------------------------------------------------------------------------------
// IndexedDataset

IndexedDataset::IndexedDataset(const std::string& path_prefix) : prefix_(path_prefix) {
  const std::string idx_path = path_prefix + ".idx";
  const std::string bin_path = path_prefix + ".bin";
  // Report a missing .bin before validating the .idx, so a half-copied dataset reads as such.
  if (::access(idx_path.c_str(), F_OK) == 0 && ::access(bin_path.c_str(), F_OK) != 0) {
    throw file_not_found(bin_path);
  }
  try {
    idx_ = map_file(idx_path, &idx_size_);
    validate_index(idx_path, idx_size_);
    bin_ = map_file(bin_path, &bin_size_);
    const uint64_t expected = static_cast<uint64_t>(num_tokens_) * itemsize_;
    if (bin_size_ != expected) {
      throw UserError(bin_path + ": size is " + std::to_string(bin_size_) + " bytes but " +
                      idx_path + " describes " + std::to_string(num_tokens_) + " " +
                      token_dtype_name(dtype_) + " tokens = " + std::to_string(expected) +
                      " bytes; the .bin is truncated or does not belong to this .idx "
                      "(regenerate the dataset)");
    }
  } catch (...) {
    unmap();
    throw;
  }
}

void IndexedDataset::validate_index(const std::string& path, size_t size) {
  const unsigned char* p = idx_;
  if (size < sizeof(kMagic) || std::memcmp(p, kMagic, sizeof(kMagic)) != 0) {
    throw UserError(path + ": not a Megatron indexed dataset (the file does not start with "
                    "\"MMIDIDX\\0\\0\"); pass the prefix of a dataset made by preprocess_data");
  }
  if (size < kHeaderSize) {
    throw UserError(path + ": truncated: " + std::to_string(size) + " bytes, shorter than the " +
                    std::to_string(kHeaderSize) + "-byte header; regenerate the dataset");
  }
  const uint64_t version = load<uint64_t>(p + 9);
  if (version != kVersion) {
    throw UserError(path + ": unsupported index version " + std::to_string(version) +
                    " (only version 1 is supported); regenerate with a current Megatron");
  }
  const uint8_t code = p[17];
  if (code < 1 || code > 8) {
    throw UserError(path + ": unknown dtype code " + std::to_string(code) +
                    " (valid codes are 1..8); the file is corrupt, regenerate the dataset");
  }
  dtype_ = static_cast<TokenDType>(code);
  itemsize_ = token_dtype_itemsize(dtype_);
  if (!token_dtype_is_integer(dtype_)) {
    throw UserError(path + ": dtype is " + token_dtype_name(dtype_) +
                    ", but token datasets must hold integers; tokenize with preprocess_data");
  }
  const uint64_t s = load<uint64_t>(p + 18);
  const uint64_t d = load<uint64_t>(p + 26);
  // Compare counts against the file size first so the byte arithmetic below cannot overflow.
  const size_t body = size - kHeaderSize;
  const bool fits_body = s <= body / 12 && d <= body / 8 && s * 12 + d * 8 <= body;
  if (!fits_body) {
    throw UserError(path + ": truncated: the header lists " + std::to_string(s) +
                    " sequences and " + std::to_string(d) + " document indices, more than the " +
                    std::to_string(size) + "-byte file holds; regenerate the dataset");
  }
  const size_t needed = kHeaderSize + s * 12 + d * 8;
  if (size != needed && size != needed + s) {  // + s: optional int8 multimodal modes
    throw UserError(path + ": size " + std::to_string(size) + " bytes does not match the header (" +
                    std::to_string(needed) + " bytes, or " + std::to_string(needed + s) +
                    " with multimodal modes); the file is corrupt, regenerate the dataset");
  }
  num_sequences_ = s;
  num_doc_indices_ = d;

  const PackedArrayView<int32_t> lengths = sequence_lengths();
  const PackedArrayView<int64_t> offsets = sequence_offsets();
  int64_t expected_offset = 0;
  for (size_t i = 0; i < s; ++i) {
    const int32_t len = lengths[i];
    if (len < 0) {
      throw UserError(path + ": sequence " + std::to_string(i) + " has negative length " +
                      std::to_string(len) + "; the file is corrupt, regenerate the dataset");
    }
    if (offsets[i] != expected_offset) {
      throw UserError(path + ": byte offset of sequence " + std::to_string(i) + " is " +
                      std::to_string(offsets[i]) + " but the lengths before it give " +
                      std::to_string(expected_offset) +
                      "; offsets are not consistent with lengths, the file is corrupt");
    }
    // Each step adds less than 2^34, so bounding the sum at 2^62 rules out int64 overflow.
    expected_offset += static_cast<int64_t>(len) * static_cast<int64_t>(itemsize_);
    if (expected_offset > (int64_t{1} << 62)) {
      throw UserError(path + ": sequence lengths add up to more than 2^62 bytes; corrupt file");
    }
  }
  num_tokens_ = expected_offset / static_cast<int64_t>(itemsize_);

  const PackedArrayView<int64_t> docs = document_indices();
  if (d == 0 || docs[0] != 0) {
    throw UserError(path + ": the document index must start with 0; the file is corrupt");
  }
  for (size_t i = 1; i < d; ++i) {
    if (docs[i] < docs[i - 1]) {
      throw UserError(path + ": document index is not monotonic at entry " + std::to_string(i) +
                      " (" + std::to_string(docs[i - 1]) + " then " + std::to_string(docs[i]) +
                      "); the file is corrupt, regenerate the dataset");
    }
  }
  if (static_cast<uint64_t>(docs[d - 1]) != s) {
    throw UserError(path + ": the document index ends at " + std::to_string(docs[d - 1]) +
                    " but there are " + std::to_string(s) +
                    " sequences; the file is corrupt, regenerate the dataset");
  }
}

IndexedDataset::~IndexedDataset() { unmap(); }

void IndexedDataset::unmap() {
  if (idx_ != nullptr) ::munmap(const_cast<unsigned char*>(idx_), idx_size_);
  if (bin_ != nullptr) ::munmap(const_cast<unsigned char*>(bin_), bin_size_);
  idx_ = nullptr;
  bin_ = nullptr;
}

IndexedDataset::IndexedDataset(IndexedDataset&& other) noexcept { *this = std::move(other); }

IndexedDataset& IndexedDataset::operator=(IndexedDataset&& other) noexcept {
  if (this != &other) {
    unmap();
    prefix_ = std::move(other.prefix_);
    dtype_ = other.dtype_;
    itemsize_ = other.itemsize_;
    num_sequences_ = other.num_sequences_;
    num_doc_indices_ = other.num_doc_indices_;
    num_tokens_ = other.num_tokens_;
    idx_ = std::exchange(other.idx_, nullptr);
    idx_size_ = std::exchange(other.idx_size_, 0);
    bin_ = std::exchange(other.bin_, nullptr);
    bin_size_ = std::exchange(other.bin_size_, 0);
    other.num_sequences_ = 0;
    other.num_doc_indices_ = 1;
    other.num_tokens_ = 0;
  }
  return *this;
}

PackedArrayView<int32_t> IndexedDataset::sequence_lengths() const {
  return {idx_ + kHeaderSize, num_sequences_};
}

PackedArrayView<int64_t> IndexedDataset::sequence_offsets() const {
  return {idx_ + kHeaderSize + num_sequences_ * 4, num_sequences_};
}

PackedArrayView<int64_t> IndexedDataset::document_indices() const {
  return {idx_ + kHeaderSize + num_sequences_ * 12, num_doc_indices_};
}

int64_t IndexedDataset::sequence_length(size_t i) const {
  if (i >= num_sequences_) {
    throw std::out_of_range("IndexedDataset::sequence_length: sequence " + std::to_string(i) +
                            " >= " + std::to_string(num_sequences_) + " in " + prefix_);
  }
  return sequence_lengths()[i];
}

void IndexedDataset::read_tokens(size_t seq, size_t offset, size_t count, int64_t* out) const {
  const size_t len = static_cast<size_t>(sequence_length(seq));  // checks seq
  if (offset > len || count > len - offset) {
    throw std::out_of_range("IndexedDataset::read_tokens: tokens [" + std::to_string(offset) +
                            ", " + std::to_string(offset) + "+" + std::to_string(count) +
                            ") outside sequence " + std::to_string(seq) + " of length " +
                            std::to_string(len) + " in " + prefix_);
  }
  if (count == 0) return;
  const unsigned char* src =
      bin_ + static_cast<size_t>(sequence_offsets()[seq]) + offset * itemsize_;
  switch (dtype_) {
    case TokenDType::kUInt8: widen<uint8_t>(src, count, out); break;
    case TokenDType::kInt8: widen<int8_t>(src, count, out); break;
    case TokenDType::kInt16: widen<int16_t>(src, count, out); break;
    case TokenDType::kUInt16: widen<uint16_t>(src, count, out); break;
    case TokenDType::kInt32: widen<int32_t>(src, count, out); break;
    case TokenDType::kInt64: widen<int64_t>(src, count, out); break;
    default: throw std::logic_error("IndexedDataset: float dtype passed validation");
  }
}

// ----------------------------------------------------------------------------------------------
// IndexedDatasetBuilder

IndexedDatasetBuilder::IndexedDatasetBuilder(const std::string& path_prefix, TokenDType dtype)
    : prefix_(path_prefix), dtype_(dtype), itemsize_(token_dtype_itemsize(dtype)) {
  if (!token_dtype_is_integer(dtype)) {
    throw std::invalid_argument(std::string("IndexedDatasetBuilder: dtype ") +
                                token_dtype_name(dtype) + " cannot hold token ids");
  }
  // The pid keeps concurrent writers (e.g. one process per shard) from sharing a temp name.
  const std::string suffix = ".tmp-" + std::to_string(::getpid());
  bin_tmp_ = prefix_ + ".bin" + suffix;
  idx_tmp_ = prefix_ + ".idx" + suffix;
  bin_fd_ = ::open(bin_tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (bin_fd_ < 0) {
    throw UserError(bin_tmp_ + ": cannot create: " + errno_text(errno) +
                    "; check that the output directory exists and is writable");
  }
  buffer_.reserve(kBufferBytes);
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  if (bin_fd_ >= 0) ::close(bin_fd_);
  if (!finalized_) {
    // Abandoned (exception or early return): leave nothing that looks like a dataset.
    ::unlink(bin_tmp_.c_str());
    ::unlink(idx_tmp_.c_str());
  }
}

void IndexedDatasetBuilder::check_open(const char* what) const {
  if (finalized_ || bin_fd_ < 0) {
    throw std::logic_error(std::string("IndexedDatasetBuilder::") + what + " after finalize() for " +
                           prefix_);
  }
}

void IndexedDatasetBuilder::check_tokens(const int64_t* tokens, size_t n) const {
  for (size_t i = 0; i < n; ++i) {
    const int64_t t = tokens[i];
    bool ok = true;
    switch (dtype_) {
      case TokenDType::kUInt8: ok = fits<uint8_t>(t); break;
      case TokenDType::kInt8: ok = fits<int8_t>(t); break;
      case TokenDType::kInt16: ok = fits<int16_t>(t); break;
      case TokenDType::kUInt16: ok = fits<uint16_t>(t); break;
      case TokenDType::kInt32: ok = fits<int32_t>(t); break;
      default: break;
    }
    if (t < 0) ok = false;  // token ids are never negative, whatever the dtype could store
    if (!ok) {
      throw UserError(prefix_ + ": token " + std::to_string(t) + " (position " +
                      std::to_string(i) + " of sequence " + std::to_string(lengths_.size()) +
                      ") does not fit dtype " + token_dtype_name(dtype_) +
                      (t < 0 ? "; token ids must be non-negative, check the tokenizer output"
                             : "; use int32 (pick the dtype with token_dtype_for_vocab from the "
                               "tokenizer's real vocab size, which must exceed every token id)"));
    }
  }
}

void IndexedDatasetBuilder::flush_buffer() {
  if (!buffer_.empty()) write_all(bin_fd_, buffer_.data(), buffer_.size(), bin_tmp_);
  buffer_.clear();
}

void IndexedDatasetBuilder::buffer_bytes(const void* data, size_t n) {
  if (buffer_.size() + n > kBufferBytes) flush_buffer();
  if (n >= kBufferBytes) {
    write_all(bin_fd_, data, n, bin_tmp_);
    return;
  }
  const unsigned char* p = static_cast<const unsigned char*>(data);
  buffer_.insert(buffer_.end(), p, p + n);
}

namespace {

// Narrows tokens to T in small stack chunks so the builder never holds a whole sequence converted.
template <typename T, typename Sink>
void narrow_into(const int64_t* tokens, size_t n, Sink&& sink) {
  constexpr size_t kChunk = 4096;
  T chunk[kChunk];
  for (size_t start = 0; start < n; start += kChunk) {
    const size_t m = std::min(kChunk, n - start);
    for (size_t i = 0; i < m; ++i) chunk[i] = static_cast<T>(tokens[start + i]);
    sink(chunk, m * sizeof(T));
  }
}

}  // namespace

void IndexedDatasetBuilder::add_sequence(const int64_t* tokens, size_t n) {
  check_open("add_sequence");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw UserError(prefix_ + ": sequence " + std::to_string(lengths_.size()) + " has " +
                    std::to_string(n) + " tokens; the format stores lengths as int32, so split "
                    "the document into smaller sequences");
  }
  check_tokens(tokens, n);  // before writing, so a bad token leaves the builder unchanged
  auto sink = [this](const void* data, size_t bytes) { buffer_bytes(data, bytes); };
  switch (dtype_) {
    case TokenDType::kUInt8: narrow_into<uint8_t>(tokens, n, sink); break;
    case TokenDType::kInt8: narrow_into<int8_t>(tokens, n, sink); break;
    case TokenDType::kInt16: narrow_into<int16_t>(tokens, n, sink); break;
    case TokenDType::kUInt16: narrow_into<uint16_t>(tokens, n, sink); break;
    case TokenDType::kInt32: narrow_into<int32_t>(tokens, n, sink); break;
    case TokenDType::kInt64: narrow_into<int64_t>(tokens, n, sink); break;
    default: throw std::logic_error("IndexedDatasetBuilder: float dtype");
  }
  lengths_.push_back(static_cast<int32_t>(n));
}

void IndexedDatasetBuilder::end_document() {
  check_open("end_document");
  doc_indices_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetBuilder::add_document(const int64_t* tokens, size_t n) {
  // preprocess_data.py records no sequence for an empty document, only the document boundary.
  if (n > 0) add_sequence(tokens, n);
  end_document();
}

void IndexedDatasetBuilder::write_idx_file(int fd) {
  buffer_.clear();
  auto put = [&](const void* data, size_t n) {
    if (buffer_.size() + n > kBufferBytes) {
      write_all(fd, buffer_.data(), buffer_.size(), idx_tmp_);
      buffer_.clear();
    }
    if (n >= kBufferBytes) {
      write_all(fd, data, n, idx_tmp_);
    } else {
      const unsigned char* p = static_cast<const unsigned char*>(data);
      buffer_.insert(buffer_.end(), p, p + n);
    }
  };
  const uint64_t version = kVersion;
  const uint8_t code = static_cast<uint8_t>(dtype_);
  const uint64_t s = lengths_.size();
  const uint64_t d = doc_indices_.size();
  put(kMagic, sizeof(kMagic));
  put(&version, 8);
  put(&code, 1);
  put(&s, 8);
  put(&d, 8);
  if (s > 0) put(lengths_.data(), s * sizeof(int32_t));
  // Offsets are derived, not stored, so memory stays at 4 bytes per sequence until here.
  int64_t offset = 0;
  for (int32_t len : lengths_) {
    put(&offset, 8);
    offset += static_cast<int64_t>(len) * static_cast<int64_t>(itemsize_);
  }
  put(doc_indices_.data(), d * sizeof(int64_t));
  if (!buffer_.empty()) write_all(fd, buffer_.data(), buffer_.size(), idx_tmp_);
  buffer_.clear();
}

void IndexedDatasetBuilder::finalize() {
  check_open("finalize");
  if (static_cast<size_t>(doc_indices_.back()) != lengths_.size()) {
    throw std::logic_error("IndexedDatasetBuilder::finalize: " +
                           std::to_string(lengths_.size() - doc_indices_.back()) +
                           " sequences added after the last end_document() for " + prefix_);
  }
  flush_buffer();
  fsync_or_throw(bin_fd_, bin_tmp_);
  const int bin_fd = std::exchange(bin_fd_, -1);
  if (::close(bin_fd) != 0) {
    throw UserError(bin_tmp_ + ": close failed: " + errno_text(errno));
  }

  int idx_fd = ::open(idx_tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (idx_fd < 0) {
    throw UserError(idx_tmp_ + ": cannot create: " + errno_text(errno) +
                    "; check that the output directory is writable");
  }
  try {
    write_idx_file(idx_fd);
    fsync_or_throw(idx_fd, idx_tmp_);
  } catch (...) {
    ::close(idx_fd);
    throw;
  }
  if (::close(idx_fd) != 0) throw UserError(idx_tmp_ + ": close failed: " + errno_text(errno));

  // .bin first: a reader that finds the new .idx is guaranteed the matching .bin is in place.
  rename_or_throw(bin_tmp_, prefix_ + ".bin");
  rename_or_throw(idx_tmp_, prefix_ + ".idx");
  finalized_ = true;
  fsync_parent_dir(prefix_);
  std::vector<unsigned char>().swap(buffer_);
}

void IndexedDatasetBuilder::merge(const std::vector<std::string>& input_prefixes,
                                  const std::string& output_prefix) {
  if (input_prefixes.empty()) {
    throw UserError("merge into " + output_prefix + ": no input datasets given");
  }
  // Open (and so validate) every input before creating any output file.
  std::vector<IndexedDataset> inputs;
  inputs.reserve(input_prefixes.size());
  for (const std::string& prefix : input_prefixes) inputs.emplace_back(prefix);
  const TokenDType dtype = inputs.front().dtype();
  for (const IndexedDataset& in : inputs) {
    if (in.dtype() != dtype) {
      throw UserError(in.path_prefix() + ".idx: dtype " + token_dtype_name(in.dtype()) +
                      " differs from " + token_dtype_name(dtype) + " of " +
                      inputs.front().path_prefix() +
                      ".idx; merge needs one dtype, re-tokenize with the same vocabulary size");
    }
  }

  IndexedDatasetBuilder out(output_prefix, dtype);
  for (const IndexedDataset& in : inputs) {
    const int64_t base = static_cast<int64_t>(out.lengths_.size());
    const PackedArrayView<int32_t> lengths = in.sequence_lengths();
    for (size_t i = 0; i < lengths.size(); ++i) out.lengths_.push_back(lengths[i]);
    // Skip the input's leading 0: it coincides with the previous dataset's last boundary.
    const PackedArrayView<int64_t> docs = in.document_indices();
    for (size_t i = 1; i < docs.size(); ++i) out.doc_indices_.push_back(base + docs[i]);

    out.flush_buffer();
    const size_t bytes = static_cast<size_t>(in.num_tokens()) * token_dtype_itemsize(dtype);
    for (size_t done = 0; done < bytes; done += kCopyChunkBytes) {
      const size_t n = std::min(kCopyChunkBytes, bytes - done);
      write_all(out.bin_fd_, in.bin_ + done, n, out.bin_tmp_);
    }
  }
  out.finalize();
}

}  // namespace megatron
