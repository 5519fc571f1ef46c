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

  // Reads `count` little-endian ids of type T (uint8_t bytes, uint16_t llm.c tokens) starting at
  // byte `offset` into out[0, count) as int32, 64 KiB per read (one pread and one change check).
  template <typename T>
  void read_ids(uint64_t offset, int64_t count, int32_t* out) const {
    T ids[kReadBytes / sizeof(T)];
    constexpr int64_t kPerRead = static_cast<int64_t>(kReadBytes / sizeof(T));
    for (int64_t done = 0; done < count;) {
      const int64_t part = count - done < kPerRead ? count - done : kPerRead;
      read(offset + static_cast<uint64_t>(done) * sizeof(T), static_cast<size_t>(part) * sizeof(T),
           ids);
      for (int64_t i = 0; i < part; ++i)
        out[done + i] = ids[i];
      done += part;
    }
  }

 private:
  static constexpr size_t kReadBytes = size_t{64} << 10;

  [[noreturn]] void changed(const std::string& how) const;

  std::string path_;
  files::UniqueFd fd_;
  size_t size_ = 0;
  int64_t mtime_sec_ = 0;
  int64_t mtime_nsec_ = 0;
};

}  // namespace trainctl::data::detail
