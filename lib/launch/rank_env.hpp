// Which rank of which job this process is, from the environment its launcher set. One binary
// serves every launcher: our own local spawner (TRAINCTL_*), Slurm's srun (SLURM_*) and
// torchrun-style launchers (RANK/WORLD_SIZE/LOCAL_RANK). No launcher: source none, one rank (the
// caller then starts the ranks itself when the recipe asks for more than one).
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace trainctl::launch {

enum class RankSource { none, trainctl, slurm, torchrun };
const char* rank_source_name(RankSource source);  // "none", "trainctl", "slurm", "torchrun"

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string hostname;  // this machine (gethostname)
  // This node by the launcher's name for it: Slurm's SLURMD_NODENAME (the name in the node list,
  // which may differ from the hostname), else the hostname.
  std::string node;
  // The nodes of the job step in Slurm's compressed form (SLURM_STEP_NODELIST, else
  // SLURM_NODELIST: "node[1-2]"), else the hostname. Expand with expand_slurm_nodelist().
  std::string node_list;
  RankSource source = RankSource::none;
  // Where the ranks rendezvous: a folder for a comm::FileStore shared by all ranks, fresh for
  // each launch attempt (TRAINCTL_RENDEZVOUS); empty: the caller picks one in the run directory.
  std::string rendezvous;
  // The job attempt, to namespace the rendezvous keys (comm::job_store): our launcher's attempt
  // id, SLURM_JOB_ID.SLURM_STEP_ID with SLURM_RESTART_COUNT, or TORCHELASTIC_RUN_ID with
  // TORCHELASTIC_RESTART_COUNT.
  std::string job_id = "local";
  int restart_count = 0;
  // The GPU this rank drives where the node has GPUs: its local rank (one rank per GPU, ranks of
  // a node numbered 0.. by the launcher). The CUDA backend takes it; see device_for_rank().
  int device_index = 0;
  // trainctl's launcher: its pid (TRAINCTL_LAUNCHER_PID), which must be this process's parent.
  int launcher_pid = 0;
  // An external launcher's ranks (RANK/WORLD_SIZE) meet through a TCP store that rank 0 serves,
  // instead of files in the run directory, when the launcher names its port (TRAINCTL_STORE_PORT;
  // launch/store_address.hpp). Slurm's and our launcher's ranks choose by cluster.shared_fs.
  bool external_tcp_store = false;

  bool launched() const { return source != RankSource::none; }
};

// The environment variables our launcher sets in each rank.
inline constexpr const char* kEnvRank = "TRAINCTL_RANK";
inline constexpr const char* kEnvWorldSize = "TRAINCTL_WORLD_SIZE";
inline constexpr const char* kEnvLocalRank = "TRAINCTL_LOCAL_RANK";
inline constexpr const char* kEnvLocalWorldSize = "TRAINCTL_LOCAL_WORLD_SIZE";
inline constexpr const char* kEnvRendezvous = "TRAINCTL_RENDEZVOUS";
inline constexpr const char* kEnvJobId = "TRAINCTL_JOB_ID";
// The launcher's pid: the TRAINCTL_ rank variables count only in a process it started itself, so
// variables left in a user's shell (copied from a rank's environment) are named in an error
// instead of making `trainctl run` act as a rank that waits for peers that never come.
inline constexpr const char* kEnvLauncherPid = "TRAINCTL_LAUNCHER_PID";

// A rank environment that is present but wrong (not a number, rank >= world size, ...). The
// message names the variable, its value and what was expected.
class RankEnvError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using Getenv = std::function<const char*(const char*)>;

// Reads, in order of precedence, TRAINCTL_RANK/TRAINCTL_WORLD_SIZE (+ TRAINCTL_LOCAL_RANK,
// TRAINCTL_LOCAL_WORLD_SIZE, TRAINCTL_RENDEZVOUS, TRAINCTL_JOB_ID); Slurm inside a job step
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or SLURM_STEP_TASKS_PER_NODE,
// SLURM_NODELIST; only when SLURM_STEP_ID is set, because a batch script sees SLURM_NTASKS of the
// whole job but is one process); RANK/WORLD_SIZE/LOCAL_RANK(/LOCAL_WORLD_SIZE). Throws
// RankEnvError when the chosen source is inconsistent, and when TRAINCTL_RANK/_WORLD_SIZE come
// without TRAINCTL_LAUNCHER_PID. `getenv` is injectable for tests.
RankInfo rank_info_from_environment(const Getenv& getenv);
// The real environment; also throws RankEnvError when TRAINCTL_LAUNCHER_PID is not this
// process's parent (the variables were left over from another process's launch).
RankInfo rank_info_from_environment();

// The one line each rank logs first: "rank 3 of 4 (local rank 1 of 2) on node2, via slurm".
std::string describe_rank(const RankInfo& info);

// The GPU index a rank uses on a node where `visible_gpus` GPUs are visible to it: none (-1)
// without GPUs; 0 when exactly one is visible (the launcher bound one GPU to each task, e.g.
// srun --gpus-per-task=1 sets CUDA_VISIBLE_DEVICES per task); else the local rank, or -1 when
// the node shows fewer GPUs than it runs ranks (two ranks must never share a GPU silently).
int device_for_rank(const RankInfo& info, int visible_gpus);

// "2(x3),1" (SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE) -> the count of node `node_index`;
// -1 when the text does not parse or has no such node.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_index);

}  // namespace trainctl::launch
