#include "files/run_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <ctime>

#include <fmt/format.h>

namespace trainctl::files {

namespace {

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char text[64];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

// What the holder wrote: "pid 4242 on node1, started 2026-11-25 16:55:01 UTC". The file is small
// and ours; anything unreadable reads as "unknown".
std::string holder_of(int fd) {
  char text[512] = {};
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  if (n <= 0) return {};
  std::string s(text, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0'))
    s.pop_back();
  for (char& c : s)
    if (c == '\n' || static_cast<unsigned char>(c) < 0x20) c = ' ';
  return s;
}

}  // namespace

RunDirLock RunDirLock::acquire(const fs::path& run_dir) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) throw_os_error("cannot create the run directory", run_dir, ec.value());
  const fs::path path = run_dir / kRunLockFile;
  // O_NOFOLLOW and O_NONBLOCK: a symlink or a FIFO planted in the lock's place is refused, never
  // followed or waited on.
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666));
  if (!fd) throw_os_error("cannot create the run lock", path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_os_error("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode))
    throw FileError(path, fmt::format("the run lock is {}, not a regular file; remove it",
                                      file_type_name(st.st_mode)));
  while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      const std::string holder = holder_of(fd.get());
      throw RunDirBusy(fmt::format(
          "run directory {} is in use by another trainctl ({}; it holds {}); wait for it to "
          "finish or stop it, or choose another run directory (--run-dir)",
          run_dir.string(), holder.empty() ? "a process that has not yet said who it is" : holder,
          path.string()));
    }
    throw_os_error("cannot lock", path, errno);
  }
  RunDirLock lock;
  const std::string previous = holder_of(fd.get());
  if (!previous.empty())
    lock.takeover_note_ = fmt::format(
        "took over the run directory's lock from {}, which is no longer running", previous);
  const std::string me = fmt::format("pid {} on {}, started {}\n", static_cast<long>(::getpid()),
                                     host_name(), utc_now());
  // Written in place: the lock lives on this inode, so the file must never be replaced by a
  // rename. Best effort: the flock is the lock, the text only names its holder, and a full disk
  // is better reported by the first file the run cannot write.
  if (::ftruncate(fd.get(), 0) == 0) (void)!::pwrite(fd.get(), me.data(), me.size(), 0);
  lock.fd_ = std::move(fd);
  return lock;
}

void RunDirLock::release() {
  if (!fd_) return;
  (void)::ftruncate(fd_.get(), 0);  // a clean end: the next run has nothing to take over
  fd_ = UniqueFd();                 // closing drops the flock
}

RunDirLock::~RunDirLock() {
  release();
}

}  // namespace trainctl::files
