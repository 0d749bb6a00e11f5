#include "core/files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/errors.h"

namespace megatron {

std::string temporary_name(const std::string& path) { return path + ".tmp-" + std::to_string(::getpid()); }

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw UserError("cannot open " + path + " to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw UserError("fsync of " + path + " failed: " + std::strerror(err));
}

void make_directories(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) throw UserError("cannot create directory " + path + ": " + ec.message());
}

void write_file_atomic(const std::string& path, std::initializer_list<std::string_view> pieces) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError("cannot create " + tmp + ": " + std::strerror(errno));
  bool ok = true;
  for (std::string_view piece : pieces) {
    const char* p = piece.data();
    size_t n = piece.size();
    while (ok && n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      ok = w >= 0;
      if (ok) p += w, n -= static_cast<size_t>(w);
    }
  }
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    throw UserError("writing " + tmp + " failed: " + std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_err = errno;
    ::unlink(tmp.c_str());
    throw UserError("cannot rename " + tmp + " to " + path + ": " + std::strerror(rename_err));
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  fsync_path(dir.empty() ? "." : dir);
}

bool is_directory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

bool is_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

namespace {

// Keeps going past entries it cannot remove (as rm -rf does); what is left stays visible.
int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  ::remove(path);
  return 0;
}

}  // namespace

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

}  // namespace megatron
