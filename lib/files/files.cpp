#include "files/files.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

namespace trainctl::files {

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
    case ENOTDIR:
      return "ENOTDIR";
    case EISDIR:
      return "EISDIR";
    case ENXIO:
      return "ENXIO";
    default:
      return "errno";
  }
}

}  // namespace

std::string os_error_message(std::string_view operation, const fs::path& path, int error) {
  std::string hint;
  if (error == ENOSPC || error == EDQUOT) hint = ": free space on that file system";
  if (error == EFBIG) hint = ": the file size limit (ulimit -f) is too small";
  if (error == EACCES || error == EROFS || error == EPERM)
    hint = ": make it writable, or choose another directory";
  return fmt::format("{} {}: {} ({} {}){}", operation, path.string(), std::strerror(error),
                     errno_name(error), error, hint);
}

void throw_os_error(std::string_view operation, const fs::path& path, int error) {
  throw FileError(os_error_message(operation, path, error), error);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

std::string_view file_type_name(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a directory";
    case S_IFIFO:
      return "a FIFO (named pipe)";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFSOCK:
      return "a socket";
    case S_IFLNK:
      return "a symbolic link";
    default:
      return "not a regular file";
  }
}

namespace {

// Opens with O_NONBLOCK (a FIFO would block in open() itself: for reading until a writer comes,
// for writing until a reader does), refuses anything but a regular file, then clears O_NONBLOCK
// so reads and writes behave normally. O_NOCTTY: a terminal in a file's place must not become
// our controlling terminal.
UniqueFd open_checked(const fs::path& path, std::string_view what, int flags,
                      std::string_view verb) {
  UniqueFd fd(::open(path.c_str(), flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0666));
  if (!fd) throw_os_error(fmt::format("cannot {} the {}", verb, what), path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw_os_error(fmt::format("cannot stat the {}", what), path, errno);
  if (!S_ISREG(st.st_mode))
    throw FileError(path, fmt::format("the {} is {}, not a regular file; give a regular file there",
                                      what, file_type_name(st.st_mode)));
  const int status = ::fcntl(fd.get(), F_GETFL);
  if (status < 0 || ::fcntl(fd.get(), F_SETFL, status & ~O_NONBLOCK) != 0)
    throw_os_error(fmt::format("cannot {} the {}", verb, what), path, errno);
  return fd;
}

}  // namespace

UniqueFd open_regular(const fs::path& path, std::string_view what) {
  return open_checked(path, what, O_RDONLY, "open");
}

UniqueFd create_regular(const fs::path& path, std::string_view what) {
  return open_checked(path, what, O_WRONLY | O_CREAT | O_TRUNC, "create");
}

uint64_t file_size(int fd, const fs::path& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_os_error("cannot stat", path, errno);
  return static_cast<uint64_t>(st.st_size);
}

void read_exact_at(int fd, const fs::path& path, void* data, size_t bytes, uint64_t offset) {
  auto* p = static_cast<char*>(data);
  const uint64_t end = offset + bytes;
  while (bytes > 0) {
    const ssize_t n =
        ::pread(fd, p, std::min<size_t>(bytes, size_t{1} << 30), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_os_error("cannot read", path, errno);
    }
    if (n == 0) throw FileError(path, fmt::format("ends at byte {}, before byte {}", offset, end));
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

std::string read_regular_file(const fs::path& path, uint64_t max_bytes, std::string_view what) {
  const UniqueFd fd = open_regular(path, what);
  const uint64_t size = file_size(fd.get(), path);
  if (size > max_bytes)
    throw FileError(path, fmt::format("the {} has {} bytes, more than the {} a {} may have", what,
                                      size, max_bytes, what));
  std::string text(static_cast<size_t>(size), '\0');
  read_exact_at(fd.get(), path, text.data(), text.size(), 0);
  return text;
}

void write_all(int fd, const fs::path& path, const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_os_error("cannot write", path, errno);
    }
    if (n == 0) throw_os_error("cannot write", path, ENOSPC);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void create_private_directories(const fs::path& dir) {
  fs::path path;
  for (const fs::path& part : dir) {
    path /= part;
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
      throw_os_error("cannot create directory", path, errno);
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) throw_os_error("cannot create directory", dir, errno);
  if (!S_ISDIR(st.st_mode))
    throw FileError(dir, fmt::format("it is {}, not a directory", file_type_name(st.st_mode)));
}

void fsync_directory(const fs::path& dir) {
  const fs::path d = dir.empty() ? fs::path(".") : dir;
  UniqueFd fd(::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) throw_os_error("cannot open directory", d, errno);
  // EINVAL: a file system that cannot sync directories (some FUSE ones); nothing to do there.
  if (::fsync(fd.get()) != 0 && errno != EINVAL) throw_os_error("cannot fsync directory", d, errno);
}

void write_file_atomically(const fs::path& path, std::string_view content) {
  const fs::path tmp = path.parent_path() / fmt::format(".{}.tmp-{}", path.filename().string(),
                                                        static_cast<long>(::getpid()));
  UniqueFd fd = create_regular(tmp, "temporary file");
  try {
    write_all(fd.get(), path, content.data(), content.size());
    if (::fsync(fd.get()) != 0) throw_os_error("cannot write (fsync)", path, errno);
    // close() reports the write errors some file systems (NFS) defer until then.
    if (::close(fd.release()) != 0) throw_os_error("cannot write (close)", path, errno);
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw_os_error("cannot replace", path, errno);
  } catch (...) {
    fd = UniqueFd();
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_directory(path.parent_path());
}

fs::path move_aside(const fs::path& from, const fs::path& into) {
  std::error_code ec;
  fs::create_directories(into, ec);
  if (ec) throw_os_error("cannot create", into, ec.value());
  const std::string name = from.filename().string();
  for (int n = 0; n < 100000; ++n) {
    const fs::path to = into / (n == 0 ? name : fmt::format("{}.{}", name, n));
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
      fsync_directory(into);
      fsync_directory(from.parent_path());
      return to;
    }
    if (errno != EEXIST && errno != ENOTEMPTY)
      throw_os_error("cannot move " + from.string() + " to", to, errno);
  }
  throw FileError(fmt::format("cannot move {} into {}: 100000 names taken; clear that folder",
                              from.string(), into.string()),
                  EEXIST);
}

void raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  (void)::setrlimit(RLIMIT_NOFILE, &limit);
}

namespace {

// File systems the kernel makes up: nothing written there is a file.
const char* pseudo_file_system(long type) {
  switch (type) {
    case 0x9fa0:  // PROC_SUPER_MAGIC
      return "a proc file system";
    case 0x62656572:  // SYSFS_MAGIC
      return "a sysfs file system";
    case 0x1cd1:  // DEVPTS_SUPER_MAGIC
      return "a devpts file system";
    case 0x27e0eb:    // CGROUP_SUPER_MAGIC
    case 0x63677270:  // CGROUP2_SUPER_MAGIC
      return "a cgroup file system";
    case 0x64626720:  // DEBUGFS_MAGIC
      return "a debugfs file system";
    case 0x74726163:  // TRACEFS_MAGIC
      return "a tracefs file system";
    case 0x73636673:  // SECURITYFS_MAGIC
      return "a securityfs file system";
    case 0x6e736673:  // NSFS_MAGIC
      return "an nsfs file system";
    default:
      return nullptr;
  }
}

}  // namespace

std::string why_not_writable_directory(const fs::path& dir) {
  std::error_code ec;
  fs::path path = fs::absolute(dir, ec);
  if (ec) return fmt::format("{}: {}", dir.string(), ec.message());
  // The nearest part of the path that exists decides; the rest would be created.
  fs::path existing = path;
  while (true) {
    struct stat st {};
    if (::lstat(existing.c_str(), &st) == 0) {
      if (::stat(existing.c_str(), &st) != 0)
        return fmt::format("{}: a symbolic link to nothing ({})", existing.string(),
                           std::strerror(errno));
      if (!S_ISDIR(st.st_mode))
        return fmt::format("{} is {}, not a directory", existing.string(),
                           file_type_name(st.st_mode));
      break;
    }
    // ENOTDIR: a part of the path is a file; the walk up finds it and says so.
    if (errno != ENOENT && errno != ENOTDIR)
      return fmt::format("{}: {}", existing.string(), std::strerror(errno));
    if (!existing.has_parent_path() || existing.parent_path() == existing)
      return fmt::format("{}: no part of the path exists", path.string());
    existing = existing.parent_path();
  }
  struct statfs fsinfo {};
  if (::statfs(existing.c_str(), &fsinfo) == 0)
    if (const char* pseudo = pseudo_file_system(static_cast<long>(fsinfo.f_type)))
      return fmt::format("{} is on {}, where no file can be kept", existing.string(), pseudo);
  if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    const int error = errno;
    return fmt::format("{}: {}{}", existing.string(), std::strerror(error),
                       error == EROFS ? "" : " (no permission to create files there)");
  }
  return "";
}

}  // namespace trainctl::files
