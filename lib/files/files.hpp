// lib/files: how trainctl touches the file system, in one place, so every command keeps the same
// promises (docs/reliability.md):
//   - a file trainctl rewrites is never lost: write_file_atomically writes a temporary file in the
//     same folder, checks every write, fsyncs it, renames it over the old one and fsyncs the
//     folder. When any step fails the temporary file is removed and the old file is untouched.
//   - a file trainctl reads never hangs it: open_regular opens without blocking (a FIFO or a
//     device in a file's place would block in open() or read()), refuses anything that is not a
//     regular file (fstat), and only then reads.
//   - an input never costs more than its documented size: read_regular_file refuses a file larger
//     than its limit before reading a byte of it.
// Every failure is a FileError whose message names the operation, the path, the OS error and,
// where there is one, the fix ("free space on that file system").
//
// Depends only on the standard library and fmt.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

namespace trainctl::files {

namespace fs = std::filesystem;

class FileError : public std::runtime_error {
 public:
  // An OS call failed: `message` from os_error_message.
  FileError(const std::string& message, int os_error)
      : std::runtime_error(message), reason_(message), os_error_(os_error) {}
  // The file itself is wrong (a FIFO, too large): what() is "<path>: <reason>".
  FileError(const fs::path& path, const std::string& reason)
      : std::runtime_error(path.string() + ": " + reason), reason_(reason), os_error_(0) {}
  // The errno behind the failure, or 0 when the file itself was wrong.
  int os_error() const { return os_error_; }
  // What was wrong without the leading path, for callers whose report names the file already
  // ("the recipe is a FIFO (named pipe), not a regular file; ..."); what() for OS errors.
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
  int os_error_;
};

// "cannot write runs/a/recipe.yaml: No space left on device (ENOSPC): free space on that file
// system". The hint depends on the error (space, permissions, read-only file system, ulimit -f).
std::string os_error_message(std::string_view operation, const fs::path& path, int error);
[[noreturn]] void throw_os_error(std::string_view operation, const fs::path& path, int error);

// An open file descriptor, closed on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// Now, as the times trainctl writes into its files: "2026-11-29T04:41:55Z" (ISO 8601, UTC).
std::string utc_timestamp();

// What the file at a path is, in words: "a FIFO", "a directory", "a character device", ...
std::string_view file_type_name(unsigned mode);

// Opens `path` read-only without blocking and checks that it is a regular file; the returned
// descriptor reads normally (O_NONBLOCK is cleared). `what` names the file in messages ("recipe",
// "checkpoint manifest"): "runs/a/checkpoints/latest: the checkpoint pointer is a FIFO, not a
// regular file; replace it with a regular file". Throws FileError.
UniqueFd open_regular(const fs::path& path, std::string_view what);
// The same checks for a file trainctl writes: creates or truncates `path` write-only (mode 0666
// less the umask). A FIFO in its place fails at once (ENXIO without a reader) or is refused.
UniqueFd create_regular(const fs::path& path, std::string_view what);

// The size of an open file (fstat). Throws FileError naming `path`.
uint64_t file_size(int fd, const fs::path& path);

// Reads the whole of a regular file (open_regular), refusing one larger than max_bytes before
// reading it: "recipes/big.yaml: the recipe has 52428800 bytes, more than the 1048576 a recipe may
// have". Throws FileError.
std::string read_regular_file(const fs::path& path, uint64_t max_bytes, std::string_view what);

// Reads exactly `bytes` at `offset`; a file that ends first is a FileError ("... ends at byte N,
// before byte M").
void read_exact_at(int fd, const fs::path& path, void* data, size_t bytes, uint64_t offset);

// Writes all of `data` (loops over short writes and EINTR). Throws FileError.
void write_all(int fd, const fs::path& path, const void* data, size_t bytes);

// Replaces `path` with `content` atomically (see the top of this file). The new file gets mode
// 0666 less the umask, like any file the user creates. Throws FileError; the old file is then
// untouched and no temporary file is left.
void write_file_atomically(const fs::path& path, std::string_view content);

// Creates `dir` and its missing parents, each new folder with mode 0700 whatever the umask (for
// what only the job's user may read: the rendezvous keys). Folders that exist keep their mode.
// Throws FileError, also when `dir` exists and is not a folder.
void create_private_directories(const fs::path& dir);

// fsync of a folder, so a rename or a new entry in it survives a crash. Throws FileError.
void fsync_directory(const fs::path& dir);

// Moves `from` into folder `into` under its own name, or, when that name is taken, under
// "<name>.1", "<name>.2", ...: nothing already there is ever replaced (renameat2 NOREPLACE).
// Creates `into`. Returns the path it was moved to. Throws FileError.
fs::path move_aside(const fs::path& from, const fs::path& into);

// Raises this process's soft limit of open files to its hard limit (as Go's runtime does at
// start): a dataset of thousands of shards keeps one descriptor per shard open (lib/data reads
// with pread, never through a memory map). Best effort: a failure leaves the limit as it was.
void raise_open_file_limit();

// Why files cannot be created in directory `dir` (which may not exist yet: then its nearest
// existing ancestor decides), or "" when they can: "/proc/x: /proc is a proc file system, not a
// place for files", "runs/a: it is a regular file, not a directory", "/mnt/ro: read-only file
// system". Checked before anything is created, so a bad --run-dir is bad input, not a failure
// after the model was built.
std::string why_not_writable_directory(const fs::path& dir);

}  // namespace trainctl::files
