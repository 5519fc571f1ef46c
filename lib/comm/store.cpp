// Store::get/wait (polling with backoff), FileStore and job_store().
#include "comm/store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "comm/error.hpp"
#include "files/files.hpp"

namespace trainctl::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Sleeps 1 ms, then doubles up to 50 ms: fast when a peer is right behind us, cheap when it is not.
class Backoff {
 public:
  void sleep() {
    std::this_thread::sleep_for(delay_);
    delay_ = std::min(delay_ * 2, Milliseconds(50));
  }

 private:
  Milliseconds delay_{1};
};

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

std::string Store::get(const std::string& key, Milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  Backoff backoff;
  while (true) {
    if (auto value = try_get(key)) return std::move(*value);
    if (Clock::now() >= deadline) {
      throw CommError(CommError::Kind::timeout,
                      "store.get: key '" + key + "' did not appear within " +
                          std::to_string(timeout.count()) + " ms in " + describe() +
                          "; the rank that sets it has not arrived (check that every rank "
                          "started and uses the same store, job id and restart count)",
                      "store.get");
    }
    backoff.sleep();
  }
}

void Store::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  Backoff backoff;
  std::vector<std::string> missing = keys;
  while (true) {
    std::vector<std::string> still;
    for (const auto& key : missing)
      if (!try_get(key)) still.push_back(key);
    missing = std::move(still);
    if (missing.empty()) return;
    if (Clock::now() >= deadline) {
      std::string list;
      for (const auto& key : missing)
        list += (list.empty() ? "'" : ", '") + key + "'";
      throw CommError(CommError::Kind::timeout,
                      "store.wait: " + std::to_string(missing.size()) + " of " +
                          std::to_string(keys.size()) + " keys still missing after " +
                          std::to_string(timeout.count()) + " ms in " + describe() + ": " + list,
                      "store.wait");
    }
    backoff.sleep();
  }
}

// ---- FileStore ----------------------------------------------------------------------------------

// The keys (transport addresses, a communicator id) are the job's own: new folders are 0700.
FileStore::FileStore(std::string dir) : dir_(std::move(dir)) {
  try {
    files::create_private_directories(dir_);
  } catch (const files::FileError& error) {
    throw CommError(CommError::Kind::io,
                    std::string("file store: ") + error.what() +
                        "; pick a writable folder that every rank can see",
                    "store.open");
  }
}

std::string FileStore::describe() const {
  return "file store " + dir_;
}

// Keys may hold '/' and other characters: escape everything but [A-Za-z0-9._-] as %XX so each
// key is exactly one file name.
std::string FileStore::path_of(const std::string& key) const {
  static const char* hex = "0123456789ABCDEF";
  std::string name;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      name += static_cast<char>(c);
    } else {
      name += '%';
      name += hex[c >> 4];
      name += hex[c & 15];
    }
  }
  if (name.empty() || name[0] == '.') name = "%" + name;  // never ".", ".." or a hidden file
  return dir_ + "/" + name;
}

namespace {

std::atomic<uint64_t> temp_counter{0};

// The value in a new file (0600: only the job's user reads the keys), renamed over the key's.
void write_atomically(const std::string& path, std::string_view value) {
  const std::string temp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(temp_counter.fetch_add(1));
  try {
    files::UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd) files::throw_os_error("cannot create", temp, errno);
    files::write_all(fd.get(), temp, value.data(), value.size());
    if (::close(fd.release()) != 0) files::throw_os_error("cannot write (close)", temp, errno);
    if (std::rename(temp.c_str(), path.c_str()) != 0)
      files::throw_os_error("cannot rename to " + path, temp, errno);
  } catch (const files::FileError& error) {
    std::remove(temp.c_str());
    throw CommError(CommError::Kind::io, std::string("file store: ") + error.what(), "store.set");
  }
}

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

// fcntl record locks are per process: the mutex keeps two threads of one process apart.
std::mutex add_mutex;

}  // namespace

void FileStore::set(const std::string& key, std::string_view value) {
  write_atomically(path_of(key), value);
}

std::optional<std::string> FileStore::try_get(const std::string& key) {
  return read_file(path_of(key));
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> guard(add_mutex);
  const std::string path = path_of(key);
  const std::string lock_path = path + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw CommError(CommError::Kind::io,
                    "file store: cannot open lock file '" + lock_path + "': " + errno_text(),
                    "store.add");
  }
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  while (::fcntl(fd, F_SETLKW, &lock) != 0) {
    if (errno == EINTR) continue;
    const std::string why = errno_text();
    ::close(fd);
    throw CommError(CommError::Kind::io, "file store: cannot lock '" + lock_path + "': " + why,
                    "store.add");
  }
  int64_t value = 0;
  try {
    if (auto old = read_file(path)) {
      try {
        value = std::stoll(*old);
      } catch (const std::exception&) {
        throw CommError(CommError::Kind::usage,
                        "store.add: key '" + key + "' holds '" + old->substr(0, 32) +
                            "', not a counter; use a key that only add() writes",
                        "store.add");
      }
    }
    value += delta;
    write_atomically(path, std::to_string(value));
  } catch (...) {
    ::close(fd);  // closing releases the lock
    throw;
  }
  ::close(fd);
  return value;
}

// ---- job namespacing ----------------------------------------------------------------------------

PrefixStore job_store(Store& base, const std::string& job_id, int restart_count) {
  if (job_id.empty() || job_id.find('/') != std::string::npos) {
    throw CommError(CommError::Kind::usage,
                    "job store: job id '" + job_id +
                        "' must be non-empty and contain no '/' (use e.g. SLURM_JOB_ID or the run "
                        "directory's name)",
                    "store.open");
  }
  if (restart_count < 0) {
    throw CommError(CommError::Kind::usage,
                    "job store: restart count " + std::to_string(restart_count) +
                        " is negative; use 0 for the first attempt",
                    "store.open");
  }
  return PrefixStore(base, job_id + "/" + std::to_string(restart_count) + "/");
}

}  // namespace trainctl::comm
