// The run directory's lock: one training (run or resume) per run directory at a time.
//
// `trainctl run` and `trainctl resume` take an exclusive flock(2) on <run_dir>/trainctl.lock before
// they change anything in the directory, and hold it for the whole run (the local launcher holds
// it for its ranks; under srun or torchrun rank 0 holds it). A second run or resume on the same
// directory is refused (exit 2) with the holder's pid, host and start time, which the holder
// writes into the file. The kernel drops a flock when its process dies, however it dies, so the
// lock of a dead process is free: the next run takes it over and says whose it was. The file is
// never removed or renamed (that would let two processes lock two different files); a clean
// release empties it.
#pragma once

#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>

#include "files/files.hpp"

namespace trainctl::files {

inline constexpr const char* kRunLockFile = "trainctl.lock";

// The run directory is locked by a live process; what() names it and says what to do.
class RunDirBusy : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class RunDirLock {
 public:
  // Creates run_dir (and parents) and takes its lock without waiting. Throws RunDirBusy when
  // another process holds it, FileError when the directory or file cannot be created.
  static RunDirLock acquire(const fs::path& run_dir);

  RunDirLock() = default;
  RunDirLock(RunDirLock&&) noexcept = default;
  RunDirLock& operator=(RunDirLock&&) noexcept = default;
  ~RunDirLock();

  bool held() const { return static_cast<bool>(fd_); }
  // Set when the lock was left by a process that died: "took over the lock of pid 4242 on node1
  // (started 2026-11-25 16:55:01 UTC), which is no longer running".
  const std::optional<std::string>& takeover_note() const { return takeover_note_; }
  // Empties the file and drops the lock (also done by the destructor).
  void release();

 private:
  UniqueFd fd_;
  std::optional<std::string> takeover_note_;
};

}  // namespace trainctl::files
