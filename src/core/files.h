// Crash-safe file writing: data goes to a temporary name in the same directory, is fsynced,
// then renamed over the final name, and the directory is fsynced, so a crash at any point
// leaves either the old file or the complete new one, never a half-written file.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

namespace megatron {

// Writes the concatenation of `pieces` to `path`. The temporary name is unique per process and
// call (O_EXCL), so ranks or threads writing the same file never share one.
void write_file_atomic(const std::string& path, std::initializer_list<std::string_view> pieces);
inline void write_file_atomic(const std::string& path, const std::string& contents) {
  write_file_atomic(path, {std::string_view(contents)});
}
std::string read_file(const std::string& path);  // UserError naming the path if unreadable
void fsync_path(const std::string& path);         // a file or a directory
void make_directories(const std::string& path);   // mkdir -p; UserError on failure
// rm -rf: the tree under `path`, if any, without following links. POSIX nftw rather than
// std::filesystem::remove_all, which crashed on the GPU machine (2026-11-30; its libstdc++ differs
// from the one the binary was built against).
void remove_tree(const std::string& path);
std::string temporary_name(const std::string& path);  // "<path>.tmp-<pid>"
// std::filesystem's checks without exceptions: an unreadable path is simply "not one".
bool is_directory(const std::string& path);
bool is_file(const std::string& path);  // a regular file, or a link to one

}  // namespace megatron
