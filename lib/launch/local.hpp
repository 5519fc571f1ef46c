// The local launcher: `trainctl run` with world size > 1 and no rank environment starts the ranks
// itself, as copies of this executable with the same arguments, and supervises them
// (supervisor.hpp). Run directory layout it adds:
//   logs/rank_<N>.log        each rank's stdout and stderr (rank 0's stderr stays on the terminal)
//   logs/ranks.json          the attempt id and the pid of every rank (for tools and tests)
//   rendezvous/<attempt>/    the ranks' file store (0700), removed when they have all exited
// With cluster.shared_fs: false the caller serves a TCP store instead and passes its address and
// secret through LocalLaunch::env (lib/run/checks.cpp, start_session).
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace trainctl::launch {

struct LocalLaunch {
  std::vector<std::string> argv;  // the command every rank runs, argv[0] an executable path
  std::filesystem::path run_dir;
  int world_size = 1;
  std::string layout;       // for messages: "tp1 ep1 dp2 pp1 (order tp-ep-dp-pp)"
  std::string command;      // "run" or "resume", prefixes messages
  int available_cores = 0;  // 0: std::thread::hardware_concurrency()
  std::chrono::milliseconds grace{5000};
  // More variables for every rank, e.g. the address and secret of a TCP store the caller serves
  // (cluster.shared_fs: false). Handed over in the environment only: never argv, never a log.
  std::vector<std::pair<std::string, std::string>> env;
};

// This process's command line with argv[0] replaced by the path of its executable
// (/proc/self/exe), so the ranks run the same binary even if PATH changes.
std::vector<std::string> own_command_line();

// OPENBLAS_NUM_THREADS for each of `ranks` ranks on `cores` cores: max(1, cores / ranks).
int blas_threads_per_rank(int cores, int ranks);

// Starts and supervises the ranks; prints the outcome on stderr; returns the exit code (0, 75
// when all ranks saved after a stop signal, 2 when a rank rejected its input, else 1).
int launch_local(const LocalLaunch& launch);

}  // namespace trainctl::launch
