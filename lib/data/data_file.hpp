// Internal to lib/data: a data file read with pread, checked on every read against what it was
// when it was opened.
//
// Why not a memory map: another process that truncates a mapped file turns the next read of a
// page past the new end into SIGBUS, which kills the run without a message or a checkpoint.
// pread of a file that shrank returns short instead, and a file whose size or modification time
// differs from what was opened is refused with a DataError naming it, so the run can stop cleanly.
// Reads go through the page cache either way, which ranks on one node share.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "files/files.hpp"

namespace trainctl::data::detail {

class DataFile {
 public:
  // Opens `path` without blocking and checks it is a non-empty regular file. Throws DataError
  // naming the file when it is missing, unreadable, not a regular file (a FIFO) or empty.
  explicit DataFile(std::string path);
  DataFile(DataFile&&) noexcept = default;
  DataFile& operator=(DataFile&&) = delete;
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;

  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Copies bytes [offset, offset + bytes) into `out`. Throws DataError when the file has changed
  // since it was opened (its size or modification time) or ends early: the data changed under the
  // run. Thread-safe (pread).
  void read(uint64_t offset, size_t bytes, void* out) const;

 private:
  [[noreturn]] void changed(const std::string& how) const;

  std::string path_;
  files::UniqueFd fd_;
  size_t size_ = 0;
  int64_t mtime_sec_ = 0;
  int64_t mtime_nsec_ = 0;
};

}  // namespace trainctl::data::detail
