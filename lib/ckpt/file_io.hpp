// POSIX file helpers for checkpoints (internal to lib/ckpt): every failure becomes a
// CheckpointError naming the path, the operation and the OS error ("No space left on device").
// Reads go through lib/files: every file is opened without blocking and must be a regular file,
// so a FIFO or a device in a checkpoint file's place is an error at once, never a hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/format.hpp"

namespace trainctl::files {
class FileError;
}

namespace trainctl::ckpt::io {

// "open /x/rank_0.bin: No space left on device (ENOSPC)" as a CheckpointError.
[[noreturn]] void throw_os_error(const std::string& operation, const fs::path& path, int error);
// A lib/files error as a CheckpointError, with the checkpoint's hint for the OS errors a user can
// fix ("... free space on that file system, or resume in a run directory on another file system").
CheckpointError checkpoint_error(const files::FileError& error);

// An open file descriptor, closed on destruction. Move-only.
class File {
 public:
  File() = default;
  static File create(const fs::path& path);  // write-only, truncating
  // Read-only, without blocking; throws CheckpointError unless `path` is a regular file.
  static File open_read(const fs::path& path);
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
// files::write_file_atomically (temporary file, fsync, rename over path, fsync the directory; on
// failure the old file is untouched and the temporary file removed), as a CheckpointError.
void write_file_atomically(const fs::path& path, const std::string& content);
// The whole of a regular file as text (files::read_regular_file): refuses a file larger than
// max_bytes before reading it, and anything that is not a regular file without blocking. `what`
// names the file in messages ("checkpoint manifest").
std::string read_small_file(const fs::path& path, uint64_t max_bytes, std::string_view what);

}  // namespace trainctl::ckpt::io
