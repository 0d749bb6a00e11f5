// Reads a text file, plain or gzip-compressed (zlib; detected from the content, not the name),
// in large blocks and hands it out as batches of whole lines, so JSONL of any size streams
// through a fixed amount of memory (plus the longest line).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace megatron {

struct LineBatch {
  std::string text;         // whole lines, each ending in '\n' (one is added to a last line without)
  uint64_t first_line = 0;  // 1-based number of the first line in the file
  uint64_t num_lines = 0;
  uint64_t bytes = 0;       // input bytes covered (text.size() less any added newline)
};

class LineBatchReader {
 public:
  // Throws UserError naming the path when it cannot be opened.
  LineBatchReader(const std::string& path, size_t target_batch_bytes);
  ~LineBatchReader();
  LineBatchReader(const LineBatchReader&) = delete;
  LineBatchReader& operator=(const LineBatchReader&) = delete;

  // The next batch, or nullopt at the end. Throws UserError on read or decompression errors.
  std::optional<LineBatch> next();

  bool compressed() const { return compressed_; }
  // The file size when it is plain text (what the batches add up to), else nullopt.
  std::optional<uint64_t> total_bytes() const;

 private:
  bool fill();  // appends one block to pending_; false at end of input

  std::string path_;
  size_t target_;
  void* gz_ = nullptr;  // gzFile; void* keeps zlib.h out of this header
  bool compressed_ = false;
  uint64_t file_size_ = 0;
  bool eof_ = false;
  std::string pending_;  // read but not yet handed out
  uint64_t next_line_ = 1;
};

}  // namespace megatron
