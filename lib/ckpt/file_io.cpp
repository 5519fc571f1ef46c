#include "ckpt/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace trainctl::ckpt::io {

namespace {
const char* errno_name(int error) {
  switch (error) {
    case ENOSPC:
      return "ENOSPC";
    case EFBIG:
      return "EFBIG";
    case EACCES:
      return "EACCES";
    case EROFS:
      return "EROFS";
    case EDQUOT:
      return "EDQUOT";
    case EIO:
      return "EIO";
    case ENOENT:
      return "ENOENT";
    case EEXIST:
      return "EEXIST";
    case EPERM:
      return "EPERM";
    default:
      return "errno";
  }
}
}  // namespace

void throw_os_error(const std::string& operation, const fs::path& path, int error) {
  std::string hint;
  if (error == ENOSPC || error == EDQUOT)
    hint = ": free space on that file system or move checkpoint.dir";
  if (error == EFBIG) hint = ": the file size limit (ulimit -f) is too small for this checkpoint";
  if (error == EACCES || error == EROFS || error == EPERM)
    hint = ": make the directory writable or point checkpoint.dir elsewhere";
  throw CheckpointError(fmt::format("{} {}: {} ({} {}){}", operation, path.string(),
                                    std::strerror(error), errno_name(error), error, hint));
}

File File::create(const fs::path& path) {
  File f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd_ < 0) throw_os_error("cannot create", path, errno);
  return f;
}

File File::open_read(const fs::path& path) {
  File f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) throw_os_error("cannot open", path, errno);
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
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_os_error("cannot write", path_, errno);
    }
    if (n == 0) throw_os_error("cannot write", path_, ENOSPC);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void File::read_exact(void* data, size_t bytes, uint64_t offset) const {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n =
        ::pread(fd_, p, std::min<size_t>(bytes, size_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_os_error("cannot read", path_, errno);
    }
    if (n == 0)
      throw CheckpointError(
          fmt::format("{} is truncated: it ends before byte {}; the checkpoint is "
                      "corrupt: use an earlier one",
                      path_.string(), offset + bytes));
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
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
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_os_error("cannot open directory", dir, errno);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0 && error != EINVAL) throw_os_error("cannot fsync directory", dir, error);
}

void write_file_atomically(const fs::path& path, const std::string& content) {
  fs::path tmp = path;
  tmp += ".tmp";
  File f = File::create(tmp);
  f.write_all(content.data(), content.size());
  f.sync();
  f.close();
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw_os_error("cannot rename onto", path, errno);
  fsync_directory(path.parent_path());
}

std::string read_small_file(const fs::path& path, uint64_t max_bytes) {
  File f = File::open_read(path);
  const uint64_t size = f.size();
  if (size > max_bytes)
    throw CheckpointError(
        fmt::format("{} has {} bytes, more than the {} allowed", path.string(), size, max_bytes));
  std::string text(static_cast<size_t>(size), '\0');
  f.read_exact(text.data(), text.size(), 0);
  return text;
}

}  // namespace trainctl::ckpt::io
