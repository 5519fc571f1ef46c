#include "launch/local.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <thread>

#include "files/files.hpp"
#include "launch/rank_env.hpp"
#include "launch/supervisor.hpp"

namespace fs = std::filesystem;

namespace trainctl::launch {

std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string raw{std::istreambuf_iterator<char>(in), {}};
  std::vector<std::string> argv;
  size_t start = 0;
  while (start < raw.size()) {
    size_t end = raw.find('\0', start);
    if (end == std::string::npos) end = raw.size();
    argv.push_back(raw.substr(start, end - start));
    start = end + 1;
  }
  if (argv.empty()) throw std::runtime_error("launch: cannot read /proc/self/cmdline");
  argv[0] = fs::read_symlink("/proc/self/exe").string();
  return argv;
}

int blas_threads_per_rank(int cores, int ranks) {
  return std::max(1, cores / std::max(1, ranks));
}

namespace {

std::string attempt_id() {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return "local-" + std::to_string(ms) + "-" + std::to_string(::getpid());
}

void write_ranks_json(const fs::path& path, const std::string& attempt,
                      const std::vector<pid_t>& pids) {
  std::string text = "{\"attempt\": \"" + attempt +
                     "\", \"launcher_pid\": " + std::to_string(::getpid()) + ", \"ranks\": [";
  for (size_t i = 0; i < pids.size(); ++i)
    text += (i ? ", " : "") + std::string("{\"rank\": ") + std::to_string(i) +
            ", \"pid\": " + std::to_string(pids[i]) + "}";
  text += "]}\n";
  files::write_file_atomically(path, text);
}

}  // namespace

int launch_local(const LocalLaunch& launch) {
  const std::string attempt = attempt_id();
  const fs::path logs = launch.run_dir / "logs";
  const fs::path rendezvous = launch.run_dir / "rendezvous" / attempt;
  fs::create_directories(logs);
  files::create_private_directories(rendezvous);  // the ranks' keys are theirs alone

  // Each rank's BLAS threads share the cores; results depend on the thread count, so it is
  // written into every log.
  const char* user_threads = std::getenv("OPENBLAS_NUM_THREADS");
  const int cores = launch.available_cores > 0
                        ? launch.available_cores
                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::string threads = (user_threads && *user_threads)
                                  ? std::string(user_threads)
                                  : std::to_string(blas_threads_per_rank(cores, launch.world_size));
  const char* threads_origin =
      (user_threads && *user_threads) ? "from the environment" : "set by the launcher";

  std::vector<ProcessSpec> specs;
  for (int rank = 0; rank < launch.world_size; ++rank) {
    ProcessSpec spec;
    spec.argv = launch.argv;
    spec.env = {{kEnvRank, std::to_string(rank)},
                {kEnvWorldSize, std::to_string(launch.world_size)},
                {kEnvLocalRank, std::to_string(rank)},
                {kEnvLocalWorldSize, std::to_string(launch.world_size)},
                {kEnvRendezvous, rendezvous.string()},
                {kEnvJobId, attempt},
                {kEnvLauncherPid, std::to_string(::getpid())},
                {"OPENBLAS_NUM_THREADS", threads}};
    spec.env.insert(spec.env.end(), launch.env.begin(), launch.env.end());
    spec.log = logs / ("rank_" + std::to_string(rank) + ".log");
    spec.stderr_to_terminal = rank == 0;
    std::ofstream(spec.log, std::ios::app)
        << "==== trainctl launcher: rank " << rank << " of " << launch.world_size << ", attempt "
        << attempt << ", OPENBLAS_NUM_THREADS=" << threads << " (" << threads_origin << ") ====\n";
    specs.push_back(std::move(spec));
  }
  std::fprintf(stderr, "trainctl %s: starting %d ranks (%s); their logs: %s/rank_<N>.log\n",
               launch.command.c_str(), launch.world_size, launch.layout.c_str(),
               logs.string().c_str());

  SuperviseOptions options;
  options.grace = launch.grace;
  options.on_started = [&](const std::vector<pid_t>& pids) {
    write_ranks_json(logs / "ranks.json", attempt, pids);
  };
  const SuperviseResult result = launch_and_supervise(specs, options);
  std::error_code ignored;
  fs::remove_all(rendezvous, ignored);
  fs::remove(rendezvous.parent_path(), ignored);  // only when no other attempt's folder is left

  switch (result.exit_code) {
    case 0:
      break;
    case 75:
      std::fprintf(stderr,
                   "trainctl %s: all %d ranks stopped after saving a checkpoint; continue with: "
                   "trainctl resume %s\n",
                   launch.command.c_str(), launch.world_size, launch.run_dir.string().c_str());
      break;
    default:
      std::fprintf(stderr, "trainctl %s: error: %s\n", launch.command.c_str(),
                   result.message.c_str());
      break;
  }
  return result.exit_code;
}

}  // namespace trainctl::launch
