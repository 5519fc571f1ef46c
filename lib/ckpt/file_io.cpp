#include "ckpt/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

#include "files/files.hpp"

namespace trainctl::ckpt::io {

void throw_os_error(const std::string& operation, const fs::path& path, int error) {
  throw checkpoint_error(files::FileError(files::os_error_message(operation, path, error), error));
}

CheckpointError checkpoint_error(const files::FileError& error) {
  const int e = error.os_error();
  std::string hint;
  // Checkpoints live in <run_dir>/checkpoints: the run directory is what a user can move.
  if (e == ENOSPC || e == EDQUOT)
    hint = ", or resume in a run directory on another file system (copy the run there)";
  if (e == EFBIG) hint = " for this checkpoint";
  return CheckpointError(error.what() + hint);
}

File File::create(const fs::path& path) {
  File f;
  f.path_ = path;
  try {
    f.fd_ = files::create_regular(path, "checkpoint file").release();
  } catch (const files::FileError& e) {
    throw checkpoint_error(e);
  }
  return f;
}

File File::open_read(const fs::path& path) {
  File f;
  f.path_ = path;
  try {
    f.fd_ = files::open_regular(path, "checkpoint file").release();
  } catch (const files::FileError& e) {
    throw checkpoint_error(e);
  }
  return f;
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

void File::write_all(const void* data, size_t bytes) {
  try {
    files::write_all(fd_, path_, data, bytes);
  } catch (const files::FileError& e) {
    throw checkpoint_error(e);
  }
}

void File::read_exact(void* data, size_t bytes, uint64_t offset) const {
  try {
    files::read_exact_at(fd_, path_, data, bytes, offset);
  } catch (const files::FileError& e) {
    if (e.os_error() != 0) throw checkpoint_error(e);
    throw CheckpointError(fmt::format(
        "{} is truncated: it ends before byte {}; the checkpoint is corrupt: use an earlier one",
        path_.string(), offset + bytes));
  }
}

void File::prefetch(uint64_t offset, uint64_t bytes) const {
  if (fd_ >= 0 && bytes > 0)
    (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes),
                          POSIX_FADV_WILLNEED);
}

void File::advise_sequential() const {
  if (fd_ >= 0) (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
}

void File::start_writeback(uint64_t offset, uint64_t bytes) const {
  if (fd_ >= 0 && bytes > 0)
    (void)::sync_file_range(fd_, static_cast<off64_t>(offset), static_cast<off64_t>(bytes),
                            SYNC_FILE_RANGE_WRITE);
}

uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_os_error("cannot stat", path_, errno);
  return static_cast<uint64_t>(st.st_size);
}

void File::sync() {
  if (::fsync(fd_) != 0) throw_os_error("cannot fsync", path_, errno);
}

void File::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_os_error("cannot close", path_, errno);
}

void fsync_directory(const fs::path& dir) {
  try {
    files::fsync_directory(dir);
  } catch (const files::FileError& e) {
    throw checkpoint_error(e);
  }
}

void write_file_atomically(const fs::path& path, const std::string& content) {
  try {
    files::write_file_atomically(path, content);
  } catch (const files::FileError& e) {
    throw checkpoint_error(e);
  }
}

std::string read_small_file(const fs::path& path, uint64_t max_bytes, std::string_view what) {
  try {
    return files::read_regular_file(path, max_bytes, what);
  } catch (const files::FileError& e) {
    throw checkpoint_error(e);
  }
}

}  // namespace trainctl::ckpt::io
