// `trainctl run RECIPE`: a new run. Everything that can be wrong with the input is checked before
// anything touches the disk; a run directory that already holds checkpoints is continued only
// when the recipe says checkpoint.resume: auto (otherwise `trainctl resume` is the way).
#include <fmt/core.h>

#include <filesystem>

#include "ckpt/ckpt.hpp"
#include "commands.hpp"
#include "plan_auto.hpp"
#include "planner/planner.hpp"
#include "resume_plan.hpp"
#include "session.hpp"

namespace fs = std::filesystem;

namespace trainctl::app {

namespace {

// --overwrite: the files of the earlier run go (checkpoints included), so metrics.jsonl and
// TensorBoard show only the new run. Anything else the user keeps in the directory stays.
void remove_previous_run(const fs::path& run_dir) {
  if (!fs::is_directory(run_dir)) return;
  for (const char* name : {"recipe.yaml", "metrics.jsonl", "summary.json", "logs", "checkpoints"})
    fs::remove_all(run_dir / name);
  for (const fs::directory_entry& entry : fs::directory_iterator(run_dir))
    if (entry.path().filename().string().starts_with("events.out.tfevents."))
      fs::remove(entry.path());
}

}  // namespace

int run_run(const RunOptions& options) {
  SessionInput input;
  input.recipe_label = options.recipe_path;
  input.debug_save_delay = std::chrono::milliseconds(options.debug_save_delay_ms);
  try {
    input.loaded = recipe::load_recipe_with_origins(options.recipe_path, options.overrides);
  } catch (const recipe::RecipeError& e) {
    return report_problems(e.problems(), options.recipe_path);
  }
  // parallel: auto -> the planner's top layout for this machine (plan.cpp), before any check.
  try {
    if (std::string note = resolve_parallel_auto(input.loaded.recipe); !note.empty())
      input.notes.push_back(std::move(note));
  } catch (const planner::PlanError& e) {
    return bad_input("run", e.what());
  }
  const recipe::Recipe& r = input.loaded.recipe;
  if (auto problems = unsupported_in_this_build(input.loaded); !problems.empty())
    return report_problems(problems, options.recipe_path);
  if (int code = check_rank_environment(input, "run"); code >= 0) return code;

  input.run_dir = options.run_dir.empty() ? fs::path("runs") / r.name : fs::path(options.run_dir);
  // The cheap refusals first (what the run directory already holds), then the data, which
  // check_session_input reads whole.
  const ckpt::ScanReport checkpoints = ckpt::scan(input.run_dir / "checkpoints");
  if (!options.overwrite) {
    if (!checkpoints.entries.empty()) {
      if (r.checkpoint.resume != recipe::Resume::automatic)
        return bad_input(
            "run", fmt::format("run directory {} holds checkpoints (newest: {}); continue the run "
                               "with `trainctl resume {}`, set checkpoint.resume: auto, or pass "
                               "--overwrite to start again (deleting them)",
                               input.run_dir.string(), checkpoints.entries.front().name,
                               input.run_dir.string()));
      if (int code = check_resume_input(input, "run", checkpoints); code >= 0) return code;
      if (int code = check_session_input(input, "run"); code >= 0) return code;
      return resume_session(std::move(input), "run");  // takes the lock itself
    }
    if (fs::exists(input.run_dir / "metrics.jsonl"))
      return bad_input(
          "run", fmt::format("run directory {} already holds a run (metrics.jsonl); choose another "
                             "with --run-dir or pass --overwrite to replace it",
                             input.run_dir.string()));
  }
  if (int code = check_session_input(input, "run"); code >= 0) return code;
  // From here on the directory is this run's: a second run or resume on it is refused until the
  // run ends (held across the local launcher's ranks too).
  files::RunDirLock lock;
  if (int code = lock_run_dir(input, "run", lock); code >= 0) return code;
  if (options.overwrite && owns_run_dir(input.rank)) {
    // Our launcher has cleared the directory before starting the ranks; under an external
    // launcher rank 0 does it, before the rendezvous the others wait in.
    remove_previous_run(input.run_dir);
  }
  return start_session(std::move(input), "run");
}

}  // namespace trainctl::app
