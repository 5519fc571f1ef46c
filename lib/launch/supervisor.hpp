// The local launcher's process side: start one process per rank, supervise them, and make sure
// none outlives the job. Failure policy: when a rank exits non-zero or is killed by a signal, the
// others get a grace period to exit by themselves (their collectives fail within milliseconds
// when a peer dies, or within the collective timeout when it went silent), then everything still
// running is SIGKILLed (which also ends a SIGSTOPped process) and reaped.
//
// Signals: while supervising, SIGINT, SIGTERM and SIGUSR1 of the launcher are forwarded to every
// rank (they agree on a step, save and exit 75); a second SIGINT SIGKILLs them at once. The ranks
// run in their own process group, so a Ctrl-C in the terminal reaches only the launcher, and with
// PR_SET_PDEATHSIG each rank dies with the launcher even when the launcher is SIGKILLed.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace trainctl::launch {

struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0]: the executable's path (no PATH lookup)
  // Set on top of the launcher's own environment (replacing variables of the same name).
  std::vector<std::pair<std::string, std::string>> env;
  // stdout and stderr are appended here (created if missing)...
  std::filesystem::path log;
  // ...except stderr, which stays the launcher's when true (rank 0: its progress line shows).
  bool stderr_to_terminal = false;
};

struct SuperviseOptions {
  // After the first failure, how long the others may take to exit by themselves.
  std::chrono::milliseconds grace{5000};
  // After the first failure, exits collected within this window compete for "first": a rank
  // killed by a signal is named before peers that exited because it vanished.
  std::chrono::milliseconds settle{300};
  int log_tail_lines = 10;
  // Called once every process has started, with their pids in rank order (e.g. to write
  // logs/ranks.json). Not called when a process could not be started.
  std::function<void(const std::vector<pid_t>&)> on_started;
};

struct ProcessExit {
  bool signaled = false;  // killed by a signal (code is the signal number), else exited
  int code = 0;
  bool killed_by_supervisor = false;  // SIGKILLed after the grace period or on a second Ctrl-C
  // "exit code 1", "killed by signal 9 (SIGKILL)".
  std::string describe() const;
  bool ok() const { return !signaled && code == 0; }
};

struct SuperviseResult {
  // 0: every rank exited 0. 75: every rank exited 75 (or 0), saved after a stop signal. 2: the
  // first failed rank exited 2 (bad input it found itself). 1: any other failure. 130: a second
  // SIGINT killed the ranks.
  int exit_code = 0;
  std::vector<ProcessExit> exits;  // rank order
  std::vector<pid_t> pids;
  int first_failed = -1;  // the rank named in `message`, -1 when none failed
  // Empty when all succeeded; else what failed, its status and the last lines of its log.
  std::string message;
};

// Starts every process and supervises them until all have exited (see the header comment).
// Throws std::runtime_error when a process cannot be started (the ones already started are
// killed and reaped first).
SuperviseResult launch_and_supervise(const std::vector<ProcessSpec>& processes,
                                     const SuperviseOptions& options = {});

// The last `lines` lines of a text file ("" when it cannot be read), each indented by `indent`.
std::string tail_lines(const std::filesystem::path& path, int lines,
                       const std::string& indent = "  ");

// "SIGKILL", "SIGSEGV", ... or "signal N".
std::string signal_name(int signal);

}  // namespace trainctl::launch
