// Runs a piece of a ckpt test in a forked child under a watchdog: a regression that makes a read
// hang (a FIFO opened for reading) or eat memory fails that test instead of stalling the suite.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>

namespace ckpt_test {

// What child_status() returns when the child did not exit by itself in time.
inline constexpr int kChildHung = 124;
inline constexpr int kChildCrashed = 125;

// Forks, runs `body` (which returns an exit code: 0 for success) in the child with an alarm of
// `seconds`, and returns the child's exit code, kChildHung when the alarm killed it, kChildCrashed
// for any other signal.
template <class Body>
int child_status(Body body, unsigned seconds = 10) {
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) return kChildCrashed;
  if (child == 0) {
    ::alarm(seconds);
    int code = 99;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: unexpected exception: %s\n", e.what());
      code = 98;
    }
    ::_exit(code);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM ? kChildHung : kChildCrashed;
}

// The peak resident memory of this process so far, in bytes.
inline long peak_rss_bytes() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss * 1024L;
}

}  // namespace ckpt_test
