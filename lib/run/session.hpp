// A training session: what `trainctl run` and `trainctl resume` (apps/trainctl) share once they
// know the recipe, the run directory and (for resume) the checkpoints to start from. Phases: check
// what this build can run and open the data (bad input: exit 2, nothing written) -> build the
// rank (context.hpp) -> run directory -> train (reporter.hpp, save_schedule.hpp) -> summary
// (summary.hpp).
//
// The checks return Exit: nullopt to go on, else the exit code the session ends with, its
// problem already printed.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/ckpt.hpp"
#include "comm/store_protocol.hpp"
#include "files/run_lock.hpp"
#include "launch/rank_env.hpp"
#include "recipe/recipe.hpp"

namespace trainctl::run {

// Exit codes of a session (README.md "Exit codes"; every trainctl command uses them).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // the run failed (the error message says why)
inline constexpr int kExitBadInput = 2;  // bad recipe, bad --set, bad CLI: nothing was created
// Stopped by SIGTERM/SIGUSR1/SIGINT after saving a checkpoint: `trainctl resume` (or a Slurm
// requeue) continues. 75 is EX_TEMPFAIL: "temporary failure, try again".
inline constexpr int kExitSavedOnSignal = 75;

// nullopt: go on; else the exit code, the problem already reported.
using Exit = std::optional<int>;

struct SessionData;  // context.hpp

struct SessionInput {
  recipe::LoadedRecipe loaded;
  std::string recipe_label;  // the recipe path, for problem reports
  std::filesystem::path run_dir;
  // Resuming: every entry of the checkpoints directory, newest first (ckpt::scan). The session
  // loads the newest one that is valid and reads back intact; the newer ones are reported and
  // moved to checkpoints/rejected/ once a checkpoint has loaded (never before: a failed resume
  // changes nothing).
  bool resuming = false;
  std::vector<ckpt::ScanEntry> resume_candidates;
  std::vector<std::string> notes;  // printed first
  // This process's rank. world_size 1: the whole run in this process. More: one rank of a job
  // started by our launcher (launch.hpp) or an external one; every rank runs train_session.
  launch::RankInfo rank;
  // The job's rendezvous secret (TRAINCTL_STORE_SECRET), read and checked by
  // check_rank_environment where this rank meets the others through a TCP store; empty elsewhere.
  std::optional<comm::StoreSecret> store_secret;
  // The training data, opened and checked by check_session_input before anything is created;
  // train_session opens it itself when it is missing.
  std::shared_ptr<SessionData> data;
  // Diagnostic fault injection (--debug-save-delay-ms): every checkpoint save sleeps this long
  // after each tensor it writes, so a test can signal or kill a rank in the middle of a save.
  // Zero (the default) is the production path.
  std::chrono::milliseconds debug_save_delay{0};
  // Diagnostic fault injection (--debug-slow-rank): rank `rank` sleeps `delay` at the start of
  // every step's compute, a straggler for the tests of lib/run/straggler.hpp. -1: none.
  struct SlowRank {
    int rank = -1;
    std::chrono::milliseconds delay{0};
  };
  SlowRank debug_slow_rank;
  // Diagnostic fault injection for the stability guard's tests (--debug-nan-batch,
  // --debug-spike-batch, --debug-drop-batch): train::TrainConfig's debug_*_batches, by 1-based
  // global batch index. Empty (the default) is the production path.
  struct BatchFaults {
    std::vector<int64_t> nan, spike, drop;
  };
  BatchFaults debug_batches;
};

// Prints every problem (file:line:col, or the --set) and the summary line; returns exit code 2.
int report_problems(const std::vector<recipe::Problem>& problems, const std::string& label);
// Prints "trainctl <command>: error: <message>"; returns exit code 2.
int bad_input(const std::string& command, const std::string& message);

// What this build cannot run (the CUDA device), located at the key that asked for it.
std::vector<recipe::Problem> unsupported_in_this_build(const recipe::LoadedRecipe& loaded);

// Reads this process's rank environment into input.rank and checks it against the recipe's
// layout; prints the problem (exit code 2) when it does not fit. Called before the run directory
// is touched.
Exit check_rank_environment(SessionInput& input, const std::string& command);

// The input checks that need the environment, before anything is created: the run directory can
// hold files (files::why_not_writable_directory; the run's own files, where they exist, are of
// the right kind), and the data opens and every token id is below model.vocab (a full read of the
// data: by this process when no launcher started it; split into one part per rank under srun or
// torchrun; skipped by the ranks our own launcher starts, which has read it all). Fills
// input.data.
Exit check_session_input(SessionInput& input, const std::string& command);

// Whether this process owns the run directory: no launcher started it, or it is rank 0 of an
// external launcher's job. Our own launcher owns it for the ranks it starts.
bool owns_run_dir(const launch::RankInfo& rank);

// Takes the run directory's lock (files/run_lock.hpp) when this process owns it (owns_run_dir),
// creating the directory; exit code 2 when another trainctl holds it. A lock taken over from a
// dead process adds a note.
Exit lock_run_dir(SessionInput& input, const std::string& command, files::RunDirLock& lock);

// The cheap checks of a resume, before the data is read (check_session_input) and before anything
// is created: the checkpoints `report` (a scan of input.run_dir/checkpoints) holds at least one
// entry, and training.steps is not below the newest valid one's step; exit code 2 otherwise.
Exit check_resume_input(const SessionInput& input, const std::string& command,
                        const ckpt::ScanReport& report);

// Takes the run directory's lock, scans input.run_dir/checkpoints again and trains from the newest
// checkpoint that loads intact (see SessionInput::resume_candidates). With no checkpoint at all, or
// none intact, it refuses (exit 2) listing what it found and changes nothing; a run that already
// reached training.steps is reported done (exit 0).
int resume_session(SessionInput input, const std::string& command);

// --overwrite: the files of the earlier run go (checkpoints included), so metrics.jsonl and
// TensorBoard show only the new run. Anything else the user keeps in the directory stays.
void remove_previous_run(const std::filesystem::path& run_dir);

// What run and resume call once the input is checked: train in this process (one rank, or one
// rank of a launched job), or, when the recipe needs more ranks and no launcher started this
// process, start them all here and supervise them (launch/local.hpp).
int start_session(SessionInput input, const std::string& command);

// Runs the session; returns the process exit code (0, 1, 2, or kExitSavedOnSignal). `command`
// ("run" or "resume") prefixes its error messages. With more than one rank, every rank calls it:
// they rendezvous, rank 0 alone writes the run's files and shows progress, every rank writes
// logs/rank_<N>.log; a failure of a peer (comm::CommError) ends the rank with exit code 1.
int train_session(SessionInput input, const std::string& command);

}  // namespace trainctl::run
