// POSIX file helpers for checkpoints (internal to lib/ckpt): every failure becomes a
// CheckpointError naming the path, the operation and the OS error ("No space left on device").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/format.hpp"

namespace trainctl::ckpt::io {

// "open /x/rank_0.bin: No space left on device (ENOSPC)" as a CheckpointError.
[[noreturn]] void throw_os_error(const std::string& operation, const fs::path& path, int error);

// An open file descriptor, closed on destruction. Move-only.
class File {
 public:
  File() = default;
  static File create(const fs::path& path);     // write-only, truncating
  static File open_read(const fs::path& path);  // read-only
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  void write_all(const void* data, size_t bytes);  // loops over short writes and EINTR
  // Reads exactly `bytes` at `offset`; a short file is a CheckpointError ("truncated").
  void read_exact(void* data, size_t bytes, uint64_t offset) const;
  // Asks the kernel to start reading [offset, offset + bytes) now (posix_fadvise WILLNEED), so
  // the disk works while the caller checksums what it read; a hint, errors are ignored.
  void prefetch(uint64_t offset, uint64_t bytes) const;
  // Tells the kernel the file will be read front to back (posix_fadvise SEQUENTIAL: a larger
  // read-ahead window); a hint, errors are ignored.
  void advise_sequential() const;
  // Asks the kernel to start writing [offset, offset + bytes) to the disk now
  // (sync_file_range WRITE, no waiting), so the final fsync finds little left to do; a hint.
  void start_writeback(uint64_t offset, uint64_t bytes) const;
  uint64_t size() const;
  void sync();   // fsync
  void close();  // reports close errors (NFS reports write errors there)
  const fs::path& path() const { return path_; }

 private:
  int fd_ = -1;
  fs::path path_;
};

void fsync_directory(const fs::path& dir);
// Writes a small file atomically: path.tmp, fsync, rename over path, fsync the directory.
void write_file_atomically(const fs::path& path, const std::string& content);
// The whole file as text, refusing files larger than max_bytes.
std::string read_small_file(const fs::path& path, uint64_t max_bytes);

}  // namespace trainctl::ckpt::io
