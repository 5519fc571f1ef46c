// The batch script `trainctl submit` hands to sbatch, rendered from the recipe's `slurm:` section
// and layout. Pure functions: nothing here touches the disk or runs a process.
//
// The script asks Slurm to send USR1 to the batch shell `signal_grace_s` before the time limit
// (--signal=B:USR1@N), forwards USR1/TERM to the srun step, and when the step exits 75 ("saved,
// please requeue", app::kExitSavedOnSignal) requeues the job with `scontrol requeue`, at most
// `max_requeues` times (compared with SLURM_RESTART_COUNT). A requeued job resumes from the newest
// checkpoint: the script runs `trainctl resume RUN_DIR` once a checkpoint exists. Any other
// non-zero exit ends the job with one line naming the exit code.
//
// No recipe value can run a command: every value is validated (Slurm names, time formats,
// environment variable names, option syntax) and everything that reaches a shell line is
// single-quoted. A value that fails a check raises SbatchError naming the recipe key.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "recipe/recipe.hpp"

namespace trainctl::launch {

// A recipe value the script cannot carry. key() is the recipe key ("slurm.partition"), or a
// pseudo key for a path ("run directory"), so the caller can point at where the user wrote it.
class SbatchError : public std::invalid_argument {
 public:
  SbatchError(std::string key, const std::string& message);
  const std::string& key() const { return key_; }
  const std::string& reason() const { return reason_; }  // what(), without "key: "

 private:
  std::string key_;
  std::string reason_;
};

// Everything one batch script says. Paths must be absolute (the job may start in another
// directory on another node).
struct SbatchJob {
  std::string job_name;
  int nodes = 1;
  int tasks_per_node = 1;  // ranks per node
  int gpus_per_node = 0;   // 0: no --gpus-per-node line
  std::string partition, account, qos, time;
  std::vector<std::string> extra_options;                        // "--exclusive", "--mem=0"
  std::vector<std::pair<std::string, std::string>> environment;  // exported to the ranks
  int signal_grace_s = 120;
  int max_requeues = 3;
  std::string trainctl;     // the binary
  std::string recipe_copy;  // the resolved recipe the first attempt runs
  std::string run_dir;
  std::string work_dir;  // where relative data paths of the recipe resolve
};

// The job a recipe describes. Tasks per node = world size / cluster.nodes (an error naming both
// when it does not divide). Parses slurm.extra and slurm.env; throws SbatchError.
SbatchJob sbatch_job_from_recipe(const recipe::Recipe& recipe, const std::string& trainctl,
                                 const std::string& recipe_copy, const std::string& run_dir,
                                 const std::string& work_dir);

// Every problem submit would find in the recipe's slurm.* values and in cluster.nodes against the
// layout (not checked under parallel: auto, whose layout is not known yet), each naming its key;
// empty when they are fine. `trainctl validate` reports them, so a bad value is found before
// submission. The run name and the paths are submit's own business (a name with a space runs
// fine locally).
std::vector<SbatchError> check_slurm_recipe(const recipe::Recipe& recipe);

// The script text. Validates every field first (render never emits an unchecked value); throws
// SbatchError naming the recipe key of the first bad field.
std::string render_sbatch(const SbatchJob& job);

// Where Slurm writes the job's output: <run_dir>/logs/slurm-%j.out (%j: the job id).
std::string sbatch_log_pattern(const std::string& run_dir);

// ---- the checks and the quoting, public for tests and for submit's own messages ---------------
// 'value' with each ' written as '\'' : bash reads it back as exactly `value` (any bytes but NUL).
std::string shell_quote(std::string_view value);

// "" when ok, else why not. Names: [A-Za-z0-9_.-]+ (partition, account, qos, job name). Times:
// Slurm's MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED/INFINITE.
std::string check_slurm_name(std::string_view value);
std::string check_slurm_time(std::string_view value);
std::string check_env_name(std::string_view name);

// slurm.extra split at spaces; each option is --name or --name=value with name [a-z0-9-]+ and a
// value of [A-Za-z0-9_.,:=@/+%-]+ (no shell or #SBATCH syntax). Options the script sets itself
// (--signal, --requeue, --output, ...) are refused. Throws SbatchError("slurm.extra", ...).
std::vector<std::string> parse_extra_options(std::string_view text);
// slurm.env split at spaces into NAME=VALUE; values are kept byte for byte (quoted when
// rendered). Throws SbatchError("slurm.env", ...).
std::vector<std::pair<std::string, std::string>> parse_environment(std::string_view text);

}  // namespace trainctl::launch
