// Multi-process harness for the lib/comm tests: fork() one child per rank BEFORE any Gloo device
// exists (its loop thread would not survive the fork), run the rank's body, and report its exit
// status to the parent. Children never touch Catch2: a failed expectation throws, the child prints
// the reason to stderr and exits 1.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace comm_test {

inline void expect(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error("expectation failed: " + what);
}

// A fresh folder under /tmp for one test's file store, removed by the parent at scope exit
// (children leave with _exit and never run the destructor).
struct TempDir {
  TempDir() {
    char pattern[] = "/tmp/trainctl_comm_XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
};

struct RunOptions {
  std::chrono::milliseconds deadline{30000};  // SIGKILL every child still running after this
  // When non-empty: once these ranks have exited, SIGKILL the others (e.g. a SIGSTOPped rank).
  std::set<int> required;
};

// Exit status per rank: the child's exit code, 128+signal when killed by a signal, or -1 when the
// harness had to kill it at the deadline.
// Every rank is forked before any starts: the children wait at a gate (a pipe's end of file)
// until the last fork. A parent may run threads (a TcpStoreServer's), and a child forked while
// one of them holds a lock, because earlier ranks already talk to it, inherits the lock held
// forever and hangs (seen as "rank(s) 4, 5, 6, 7 have not arrived" under load).
inline std::vector<int> run_ranks(int num_ranks, const std::function<int(int rank)>& body,
                                  const RunOptions& options = {}) {
  std::fflush(nullptr);
  int gate[2];
  if (::pipe(gate) != 0) throw std::runtime_error("run_ranks: pipe failed");
  std::vector<pid_t> pids;
  for (int rank = 0; rank < num_ranks; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(gate[1]);
      char ignored;
      while (::read(gate[0], &ignored, 1) < 0 && errno == EINTR) {
      }
      ::close(gate[0]);
      int code = 1;
      try {
        code = body(rank);
      } catch (const std::exception& error) {
        std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
      } catch (...) {
        std::fprintf(stderr, "rank %d: unknown exception\n", rank);
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  ::close(gate[0]);
  ::close(gate[1]);  // every rank is forked: open the gate
  std::vector<int> status(static_cast<size_t>(num_ranks), -2);
  const auto deadline = std::chrono::steady_clock::now() + options.deadline;
  auto pending = [&](int rank) { return status[static_cast<size_t>(rank)] == -2; };
  while (true) {
    bool any = false, required_pending = false;
    for (int rank = 0; rank < num_ranks; ++rank) {
      if (!pending(rank)) continue;
      int raw = 0;
      if (::waitpid(pids[static_cast<size_t>(rank)], &raw, WNOHANG) > 0) {
        status[static_cast<size_t>(rank)] = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
        continue;
      }
      any = true;
      if (options.required.count(rank)) required_pending = true;
    }
    if (!any) break;
    const bool give_up = std::chrono::steady_clock::now() >= deadline ||
                         (!options.required.empty() && !required_pending);
    if (give_up) {
      for (int rank = 0; rank < num_ranks; ++rank) {
        if (!pending(rank)) continue;
        ::kill(pids[static_cast<size_t>(rank)], SIGKILL);
        ::waitpid(pids[static_cast<size_t>(rank)], nullptr, 0);
        status[static_cast<size_t>(rank)] = -1;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return status;
}

// Deterministic, non-trivial test values in [-1, 1).
inline double test_value(int rank, size_t index, uint64_t seed = 1) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(rank) << 40) ^ index;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<double>(x >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

}  // namespace comm_test
