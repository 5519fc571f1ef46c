#include "data/data_file.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "data/token_source.hpp"

namespace trainctl::data::detail {

DataFile::DataFile(std::string path) : path_(std::move(path)) {
  try {
    fd_ = files::open_regular(path_, "data file");
  } catch (const files::FileError& e) {
    // Messages start with the path: the recipe key a data error belongs to is found by it.
    if (e.os_error() == 0) throw DataError(e.what());  // "<path>: the data file is a FIFO ..."
    if (e.os_error() == EMFILE || e.os_error() == ENFILE)
      throw DataError(fmt::format(
          "{}: cannot open data file: {}; every shard stays open while the run reads it: raise "
          "the open-file limit (ulimit -Hn, or the job's limits), or merge shards into fewer files",
          path_, std::strerror(e.os_error())));
    throw DataError(
        fmt::format("{}: cannot open data file: {}; check the path (relative paths "
                    "are taken from the working directory)",
                    path_, std::strerror(e.os_error())));
  }
  struct stat info {};
  if (::fstat(fd_.get(), &info) != 0)
    throw DataError(fmt::format("{}: cannot stat the data file: {}", path_, std::strerror(errno)));
  size_ = static_cast<size_t>(info.st_size);
  mtime_sec_ = info.st_mtim.tv_sec;
  mtime_nsec_ = info.st_mtim.tv_nsec;
  if (size_ == 0)
    throw DataError(fmt::format(
        "{}: the file is empty; give a data file that holds at least one token", path_));
}

void DataFile::changed(const std::string& how) const {
  throw DataError(fmt::format(
      "{}: the data file changed while the run was reading it ({}); another process wrote to it. "
      "Restore the file as it was (or point the recipe at a stable copy), then resume",
      path_, how));
}

void DataFile::read(uint64_t offset, size_t bytes, void* out) const {
  // One fstat per read (about a microsecond) catches truncation and rewrites alike, before the
  // bytes are used.
  struct stat info {};
  if (::fstat(fd_.get(), &info) != 0)
    throw DataError(fmt::format("{}: cannot stat the data file: {}", path_, std::strerror(errno)));
  if (static_cast<size_t>(info.st_size) != size_)
    changed(fmt::format("it had {} bytes when opened and has {} now", size_, info.st_size));
  if (info.st_mtim.tv_sec != mtime_sec_ || info.st_mtim.tv_nsec != mtime_nsec_)
    changed("its modification time moved since it was opened");
  try {
    files::read_exact_at(fd_.get(), path_, out, bytes, offset);
  } catch (const files::FileError& e) {
    if (e.os_error() == 0) changed(e.what());  // ended early: shrank between fstat and pread
    throw DataError(fmt::format("{}: {}", path_, e.what()));
  }
}

}  // namespace trainctl::data::detail
