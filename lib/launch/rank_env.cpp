#include "launch/rank_env.hpp"

#include <unistd.h>

#include <charconv>
#include <climits>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "launch/store_address.hpp"

namespace trainctl::launch {

const char* rank_source_name(RankSource source) {
  switch (source) {
    case RankSource::none:
      return "none";
    case RankSource::trainctl:
      return "trainctl";
    case RankSource::slurm:
      return "slurm";
    case RankSource::torchrun:
      return "torchrun";
  }
  return "?";
}

namespace {

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

class Env {
 public:
  explicit Env(const Getenv& getenv) : getenv_(getenv) {}
  bool has(const char* name) const {
    const char* v = getenv_(name);
    return v != nullptr && *v != '\0';
  }
  std::string text(const char* name) const {
    const char* v = getenv_(name);
    return v ? std::string(v) : std::string();
  }
  // A non-negative integer; throws naming the variable when it is not one.
  int integer(const char* name, const char* source) const {
    const std::string value = text(name);
    const std::optional<int> x = parse_int(value);
    if (!x || *x < 0)
      throw RankEnvError(std::string(name) + "='" + value + "' (set by " + source +
                         ") is not a non-negative integer");
    return *x;
  }
  int integer_or(const char* name, const char* source, int fallback) const {
    return has(name) ? integer(name, source) : fallback;
  }

 private:
  const Getenv& getenv_;
};

std::string host_name() {
  char buffer[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buffer, sizeof buffer - 1) != 0) return "localhost";
  return buffer;
}

void check_ranks(const RankInfo& info, const char* rank_var, const char* world_var,
                 const char* source) {
  if (info.world_size < 1)
    throw RankEnvError(std::string(world_var) + "=" + std::to_string(info.world_size) +
                       " (set by " + source + ") must be >= 1");
  if (info.rank >= info.world_size)
    throw RankEnvError(std::string(rank_var) + "=" + std::to_string(info.rank) + " is not below " +
                       world_var + "=" + std::to_string(info.world_size) + " (set by " + source +
                       ")");
  if (info.local_world_size < 1 || info.local_rank >= info.local_world_size)
    throw RankEnvError("local rank " + std::to_string(info.local_rank) +
                       " is not below the local world size " +
                       std::to_string(info.local_world_size) + " (set by " + source + ")");
}

}  // namespace

int slurm_tasks_on_node(const std::string& tasks_per_node, int node_index) {
  // Entries "N" or "N(xK)", comma-separated: K nodes with N tasks each.
  int node = 0;
  size_t pos = 0;
  while (pos < tasks_per_node.size()) {
    size_t comma = tasks_per_node.find(',', pos);
    if (comma == std::string::npos) comma = tasks_per_node.size();
    const std::string_view entry(tasks_per_node.data() + pos, comma - pos);
    const size_t paren = entry.find('(');
    const std::optional<int> tasks = parse_int(entry.substr(0, paren));
    int repeat = 1;
    if (paren != std::string_view::npos) {
      if (entry.size() < paren + 4 || entry.substr(paren, 2) != "(x" || entry.back() != ')')
        return -1;
      const std::optional<int> k = parse_int(entry.substr(paren + 2, entry.size() - paren - 3));
      if (!k || *k < 1) return -1;
      repeat = *k;
    }
    if (!tasks || *tasks < 1) return -1;
    if (node_index < node + repeat) return *tasks;
    node += repeat;
    pos = comma + 1;
  }
  return -1;
}

namespace {

// The error for TRAINCTL_ rank variables that no launcher of ours set for this process.
std::string left_over(const Env& env, const std::string& why) {
  return std::string(kEnvRank) + "=" + env.text(kEnvRank) + " and " + kEnvWorldSize + "=" +
         env.text(kEnvWorldSize) + " are in the environment, but " + why +
         ": they are trainctl's own variables for the ranks its launcher starts, left over here "
         "(a shell started from a rank's environment keeps them); unset TRAINCTL_RANK, "
         "TRAINCTL_WORLD_SIZE, TRAINCTL_LOCAL_RANK, TRAINCTL_LOCAL_WORLD_SIZE, "
         "TRAINCTL_RENDEZVOUS, TRAINCTL_JOB_ID and TRAINCTL_LAUNCHER_PID, or start the ranks "
         "with srun or torchrun";
}

}  // namespace

RankInfo rank_info_from_environment(const Getenv& getenv) {
  const Env env(getenv);
  RankInfo info;
  info.hostname = host_name();
  info.node = info.hostname;
  info.node_list = info.hostname;
  if (env.has(kEnvRank) || env.has(kEnvWorldSize)) {
    const char* src = "the trainctl launcher";
    info.source = RankSource::trainctl;
    info.rank = env.integer(kEnvRank, src);
    info.world_size = env.integer(kEnvWorldSize, src);
    info.local_rank = env.integer_or(kEnvLocalRank, src, info.rank);
    info.local_world_size = env.integer_or(kEnvLocalWorldSize, src, info.world_size);
    info.rendezvous = env.text(kEnvRendezvous);
    if (env.has(kEnvJobId)) info.job_id = env.text(kEnvJobId);
    check_ranks(info, kEnvRank, kEnvWorldSize, src);
    info.device_index = info.local_rank;
    if (!env.has(kEnvLauncherPid))
      throw RankEnvError(left_over(env, std::string(kEnvLauncherPid) + " is not"));
    info.launcher_pid = env.integer(kEnvLauncherPid, src);
    return info;
  }
  if (env.has("SLURM_PROCID") && env.has("SLURM_NTASKS") &&
      (env.has("SLURM_STEP_ID") || env.has("SLURM_STEPID"))) {
    const char* src = "Slurm";
    info.source = RankSource::slurm;
    info.rank = env.integer("SLURM_PROCID", src);
    info.world_size = env.integer("SLURM_NTASKS", src);
    info.local_rank = env.integer_or("SLURM_LOCALID", src, 0);
    const int node = env.integer_or("SLURM_NODEID", src, 0);
    info.local_world_size = -1;
    for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}) {
      if (!env.has(name)) continue;
      info.local_world_size = slurm_tasks_on_node(env.text(name), node);
      if (info.local_world_size < 1)
        throw RankEnvError(std::string(name) + "='" + env.text(name) +
                           "' (set by Slurm) does not give the task count of node " +
                           std::to_string(node));
      break;
    }
    if (info.local_world_size < 0) info.local_world_size = info.world_size;
    if (env.has("SLURMD_NODENAME")) info.node = env.text("SLURMD_NODENAME");
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_NODELIST"}) {
      if (!env.has(name)) continue;
      info.node_list = env.text(name);
      break;
    }
    info.job_id = "slurm-" + env.text("SLURM_JOB_ID") + "." +
                  env.text(env.has("SLURM_STEP_ID") ? "SLURM_STEP_ID" : "SLURM_STEPID");
    info.restart_count = env.integer_or("SLURM_RESTART_COUNT", src, 0);
    info.rendezvous = env.text(kEnvRendezvous);
    check_ranks(info, "SLURM_PROCID", "SLURM_NTASKS", src);
    info.device_index = info.local_rank;
    return info;
  }
  if (env.has("RANK") && env.has("WORLD_SIZE")) {
    const char* src = "an external launcher (RANK/WORLD_SIZE)";
    info.source = RankSource::torchrun;
    info.rank = env.integer("RANK", src);
    info.world_size = env.integer("WORLD_SIZE", src);
    info.local_rank = env.integer_or("LOCAL_RANK", src, info.rank);
    info.local_world_size = env.integer_or("LOCAL_WORLD_SIZE", src, info.world_size);
    info.job_id = env.has("TORCHELASTIC_RUN_ID") ? "torchrun-" + env.text("TORCHELASTIC_RUN_ID")
                                                 : std::string("external");
    info.restart_count = env.integer_or("TORCHELASTIC_RESTART_COUNT", src, 0);
    info.rendezvous = env.text(kEnvRendezvous);
    info.external_tcp_store = env.has(kEnvStorePort);
    check_ranks(info, "RANK", "WORLD_SIZE", src);
    info.device_index = info.local_rank;
    return info;
  }
  return info;
}

std::string describe_rank(const RankInfo& info) {
  return "rank " + std::to_string(info.rank) + " of " + std::to_string(info.world_size) +
         " (local rank " + std::to_string(info.local_rank) + " of " +
         std::to_string(info.local_world_size) + ") on " + info.node + ", via " +
         rank_source_name(info.source);
}

int device_for_rank(const RankInfo& info, int visible_gpus) {
  if (visible_gpus <= 0) return -1;
  if (visible_gpus == 1) return 0;
  return info.device_index < visible_gpus ? info.device_index : -1;
}

RankInfo rank_info_from_environment() {
  const Getenv getenv = [](const char* name) { return std::getenv(name); };
  RankInfo info = rank_info_from_environment(getenv);
  const int parent = static_cast<int>(::getppid());
  if (info.source == RankSource::trainctl && info.launcher_pid != parent)
    throw RankEnvError(left_over(
        Env(getenv), std::string(kEnvLauncherPid) + "=" + std::to_string(info.launcher_pid) +
                         " is not this process's parent (" + std::to_string(parent) + ")"));
  return info;
}

}  // namespace trainctl::launch
