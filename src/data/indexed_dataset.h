// Reader and writer for Megatron-LM's indexed dataset (prefix.bin + prefix.idx), byte-compatible
// with megatron/core/datasets/indexed_dataset.py, so datasets made by Megatron's
// tools/preprocess_data.py train here unchanged and datasets made here train in Megatron.
//
// .idx layout (little-endian, packed): 9-byte magic "MMIDIDX\0\0", u64 version (1), u8 dtype code,
// u64 sequence count S, u64 document-index count D, int32[S] sequence lengths, int64[S] byte
// offsets into .bin, int64[D] document indices (0, then one past each document's last sequence),
// optionally int8[S] multimodal modes (ignored here). .bin holds the tokens back to back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "indexed_dataset reads the little-endian Megatron format in place; big-endian hosts need byte swapping"
#endif

namespace megatron {

// Numeric codes are the on-disk values of Megatron's DType enum; never renumber them.
enum class TokenDType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};

// Bytes per element; throws std::invalid_argument for a value outside the enum.
size_t token_dtype_itemsize(TokenDType dtype);
// numpy's name for the dtype ("uint16"), used in messages.
const char* token_dtype_name(TokenDType dtype);
// True for the integer dtypes, the only ones that can hold token ids.
bool token_dtype_is_integer(TokenDType dtype);
// The dtype Megatron's preprocess_data.py picks (DType.optimal_dtype): uint16 below 65500, else int32.
TokenDType token_dtype_for_vocab(int64_t vocab_size);

// A read-only view of packed little-endian values at any alignment. The .idx arrays start at byte
// 34, so they are never aligned for their element type; memcpy makes the reads well defined and
// compiles to a plain load on x86/ARM.
template <typename T>
class PackedArrayView {
 public:
  PackedArrayView() = default;
  PackedArrayView(const unsigned char* data, size_t size) : data_(data), size_(size) {}
  size_t size() const { return size_; }
  T operator[](size_t i) const {
    T value;
    std::memcpy(&value, data_ + i * sizeof(T), sizeof(T));
    return value;
  }
  std::vector<T> to_vector() const {
    std::vector<T> out(size_);
    if (size_ > 0) std::memcpy(out.data(), data_, size_ * sizeof(T));
    return out;
  }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// A memory-mapped, fully validated indexed dataset. Opening checks every header field and array
// (one pass over the .idx) so a corrupt or truncated dataset fails at startup with a UserError
// naming the file, not with garbage batches mid-run.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& path_prefix);
  ~IndexedDataset();
  IndexedDataset(IndexedDataset&& other) noexcept;
  IndexedDataset& operator=(IndexedDataset&& other) noexcept;
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& path_prefix() const { return prefix_; }
  size_t num_sequences() const { return num_sequences_; }
  // Documents, i.e. document_indices().size() - 1.
  size_t num_documents() const { return num_doc_indices_ - 1; }
  TokenDType dtype() const { return dtype_; }
  // Total tokens in .bin.
  int64_t num_tokens() const { return num_tokens_; }

  PackedArrayView<int32_t> sequence_lengths() const;
  PackedArrayView<int64_t> sequence_offsets() const;  // byte offsets into .bin
  PackedArrayView<int64_t> document_indices() const;

  // Length of sequence i in tokens; std::out_of_range if i >= num_sequences().
  int64_t sequence_length(size_t i) const;

  // Copies tokens [offset, offset + count) of sequence `seq` to out, widened to int64.
  // std::out_of_range if the range is not inside the sequence (a caller bug, not bad data).
  void read_tokens(size_t seq, size_t offset, size_t count, int64_t* out) const;

 private:
  friend class IndexedDatasetBuilder;  // merge() copies .bin straight from the mapping

  void validate_index(const std::string& idx_path, size_t idx_size);
  void unmap();

  std::string prefix_;
  TokenDType dtype_ = TokenDType::kInt32;
  size_t itemsize_ = 4;
  size_t num_sequences_ = 0;
  size_t num_doc_indices_ = 1;
  int64_t num_tokens_ = 0;
  const unsigned char* idx_ = nullptr;  // whole .idx mapping
  size_t idx_size_ = 0;
  const unsigned char* bin_ = nullptr;  // whole .bin mapping (null when empty)
  size_t bin_size_ = 0;
};

// Writes a dataset the way Megatron's IndexedDatasetBuilder does. Tokens stream to a temporary
// .bin as they arrive (memory holds only the per-sequence lengths and document indices); finalize()
// writes the .idx and atomically renames both files into place, .idx last, so a reader never sees
// a new .idx next to a missing or partial .bin. Without finalize() the temporaries are removed.
class IndexedDatasetBuilder {
 public:
  // dtype must be an integer dtype (std::invalid_argument otherwise).
  IndexedDatasetBuilder(const std::string& path_prefix, TokenDType dtype);
  ~IndexedDatasetBuilder();
  IndexedDatasetBuilder(const IndexedDatasetBuilder&) = delete;
  IndexedDatasetBuilder& operator=(const IndexedDatasetBuilder&) = delete;

  // One document of one sequence, as preprocess_data.py writes without --split-sentences. An empty
  // document (n == 0) adds a document with no sequences, as preprocess_data.py does.
  void add_document(const int64_t* tokens, size_t n);
  // General case: any number of sequences, then end_document().
  void add_sequence(const int64_t* tokens, size_t n);
  void end_document();
  // Writes the .idx and moves both files to their final names. Every sequence must belong to a
  // document (std::logic_error otherwise). No further calls are allowed afterwards.
  void finalize();

  size_t num_sequences() const { return lengths_.size(); }
  size_t num_documents() const { return doc_indices_.size() - 1; }

  // Concatenates datasets like Megatron's tools/merge_datasets.py: same dtype required, document
  // indices shifted by the sequences before them, .bin copied in chunks. Multimodal modes are not
  // carried over.
  static void merge(const std::vector<std::string>& input_prefixes,
                    const std::string& output_prefix);

 private:
  void check_open(const char* what) const;
  void check_tokens(const int64_t* tokens, size_t n) const;
  void buffer_bytes(const void* data, size_t n);
  void flush_buffer();
  void write_idx_file(int fd);

  std::string prefix_;
  TokenDType dtype_;
  size_t itemsize_;
  std::string bin_tmp_;
  std::string idx_tmp_;
  int bin_fd_ = -1;
  bool finalized_ = false;
  std::vector<unsigned char> buffer_;  // fixed-capacity write buffer for .bin
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_indices_{0};
};

}  // namespace megatron
