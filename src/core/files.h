// Crash-safe file writing: data goes to a temporary name in the same directory, is fsynced,
// then renamed over the final name, and the directory is fsynced, so a crash at any point
// leaves either the old file or the complete new one, never a half-written file.
#pragma once

#include <string>

namespace megatron {

void write_file_atomic(const std::string& path, const std::string& contents);
std::string read_file(const std::string& path);  // UserError naming the path if unreadable
void fsync_path(const std::string& path);         // a file or a directory
void make_directories(const std::string& path);   // mkdir -p; UserError on failure
std::string temporary_name(const std::string& path);  // "<path>.tmp-<pid>"

}  // namespace megatron
