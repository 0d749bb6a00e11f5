// Line batching over zlib's gzread, which also reads uncompressed files unchanged, so plain and
// gzip input take the same path.
#include "data/line_batch_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "core/errors.h"

namespace megatron {
namespace {

constexpr unsigned kReadBlock = 1u << 18;

gzFile as_gz(void* p) { return static_cast<gzFile>(p); }

uint64_t count_newlines(const char* p, size_t n) {
  uint64_t count = 0;
  const char* end = p + n;
  while ((p = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)))) != nullptr) {
    ++count;
    ++p;
  }
  return count;
}

}  // namespace

LineBatchReader::LineBatchReader(const std::string& path, size_t target_batch_bytes)
    : path_(path), target_(target_batch_bytes == 0 ? 1 : target_batch_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw UserError(path + ": cannot open input: " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) throw UserError(path + ": is a directory; --input takes a .jsonl or .jsonl.gz file");
  file_size_ = static_cast<uint64_t>(st.st_size);
  gzFile gz = ::gzopen(path.c_str(), "rb");
  if (gz == nullptr) throw UserError(path + ": cannot open input: " + std::strerror(errno));
  gz_ = gz;
  ::gzbuffer(gz, kReadBlock);
  // Right after gzopen, gzdirect looks at the first bytes: 1 means not gzip.
  compressed_ = ::gzdirect(gz) == 0;
}

LineBatchReader::~LineBatchReader() {
  if (gz_ != nullptr) ::gzclose(as_gz(gz_));
}

std::optional<uint64_t> LineBatchReader::total_bytes() const {
  if (compressed_) return std::nullopt;
  return file_size_;
}

bool LineBatchReader::fill() {
  if (eof_) return false;
  const size_t old = pending_.size();
  pending_.resize(old + kReadBlock);
  const int n = ::gzread(as_gz(gz_), pending_.data() + old, kReadBlock);
  if (n < 0) {
    int code = 0;
    const char* msg = ::gzerror(as_gz(gz_), &code);
    pending_.resize(old);
    throw UserError(path_ + ": read failed: " + (code == Z_ERRNO ? std::strerror(errno) : msg) +
                    (compressed_ ? " (corrupt or truncated gzip?)" : ""));
  }
  pending_.resize(old + static_cast<size_t>(n));
  if (n == 0) {
    int code = 0;
    const char* msg = ::gzerror(as_gz(gz_), &code);
    if (code != Z_OK) {
      throw UserError(path_ + ": read failed: " + msg + " (corrupt or truncated gzip file)");
    }
    eof_ = true;
    return false;
  }
  return true;
}

std::optional<LineBatch> LineBatchReader::next() {
  while (pending_.size() < target_ && fill()) {
  }
  // Cut after the last newline within the target size; a longer first line is read to its end.
  size_t cut = std::string::npos;
  bool added_newline = false;
  for (;;) {
    const size_t window = std::min(pending_.size(), target_);
    const void* nl = window > 0 ? ::memrchr(pending_.data(), '\n', window) : nullptr;
    if (nl != nullptr) {
      cut = static_cast<size_t>(static_cast<const char*>(nl) - pending_.data()) + 1;
      break;
    }
    const void* first = std::memchr(pending_.data(), '\n', pending_.size());
    if (first != nullptr) {
      cut = static_cast<size_t>(static_cast<const char*>(first) - pending_.data()) + 1;
      break;
    }
    if (!fill()) {
      if (pending_.empty()) return std::nullopt;
      pending_.push_back('\n');  // a last line without a newline is still a line
      added_newline = true;
      cut = pending_.size();
      break;
    }
  }
  LineBatch batch;
  batch.text.assign(pending_, 0, cut);
  pending_.erase(0, cut);
  batch.first_line = next_line_;
  batch.num_lines = count_newlines(batch.text.data(), batch.text.size());
  batch.bytes = batch.text.size() - (added_newline ? 1 : 0);
  next_line_ += batch.num_lines;
  return batch;
}

}  // namespace megatron
