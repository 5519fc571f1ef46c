// `trainctl run RECIPE`: a new run. Everything that can be wrong with the input is checked before
// anything touches the disk; a run directory that already holds checkpoints is continued only
// when the recipe says checkpoint.resume: auto (otherwise `trainctl resume` is the way).
#include <fmt/core.h>

#include <filesystem>
#include <stdexcept>

#include "ckpt/ckpt.hpp"
#include "commands.hpp"
#include "plan_auto.hpp"
#include "planner/planner.hpp"
#include "run/session.hpp"
#include "topology/topology.hpp"

namespace fs = std::filesystem;

namespace trainctl::app {

int run_run(const RunOptions& options) {
  run::SessionInput input;
  input.recipe_label = options.recipe_path;
  input.debug_save_delay = std::chrono::milliseconds(options.debug_save_delay_ms);
  input.debug_slow_rank = {options.debug_slow_rank.first,
                           std::chrono::milliseconds(options.debug_slow_rank.second)};
  input.debug_batches = {options.debug_batches.nan, options.debug_batches.spike,
                         options.debug_batches.drop};
  try {
    input.loaded = recipe::load_recipe_with_origins(options.recipe_path, options.overrides);
  } catch (const recipe::RecipeError& e) {
    return report_problems(e.problems(), options.recipe_path);
  }
  // parallel: auto -> the planner's top layout for the job's world (plan.cpp), before any check.
  if (input.loaded.recipe.parallel.automatic) {
    try {
      const AutoWorld world =
          auto_world(input.loaded.recipe, launch::rank_info_from_environment(), options.ranks);
      input.notes.push_back(resolve_parallel_auto(input.loaded.recipe, world));
    } catch (const launch::RankEnvError& e) {
      return bad_input("run", e.what());
    } catch (const planner::PlanError& e) {
      return bad_input("run", e.what());
    } catch (const topology::ClusterError& e) {
      return bad_input("run", e.what());
    } catch (const std::invalid_argument& e) {
      return bad_input("run", e.what());
    }
  } else if (options.ranks > 0 && options.ranks != input.loaded.recipe.world_size()) {
    return bad_input(
        "run", fmt::format("--ranks {} sets the world that parallel: auto plans for, but this "
                           "recipe's layout is explicit ({} = {}): drop --ranks, or set "
                           "parallel: auto (--set parallel=auto)",
                           options.ranks, input.loaded.recipe.parallel.world_formula(),
                           input.loaded.recipe.world_size()));
  }
  const recipe::Recipe& r = input.loaded.recipe;
  if (auto problems = run::unsupported_in_this_build(input.loaded); !problems.empty())
    return report_problems(problems, options.recipe_path);
  if (Exit end = run::check_rank_environment(input, "run")) return *end;

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
      if (Exit end = run::check_resume_input(input, "run", checkpoints)) return *end;
      input.resuming = true;  // the checkpoint, not model.init_from, gives the weights
      if (Exit end = run::check_session_input(input, "run")) return *end;
      return run::resume_session(std::move(input), "run");  // takes the lock itself
    }
    if (fs::exists(input.run_dir / "metrics.jsonl"))
      return bad_input(
          "run", fmt::format("run directory {} already holds a run (metrics.jsonl); choose another "
                             "with --run-dir or pass --overwrite to replace it",
                             input.run_dir.string()));
  }
  if (Exit end = run::check_session_input(input, "run")) return *end;
  // From here on the directory is this run's: a second run or resume on it is refused until the
  // run ends (held across the local launcher's ranks too).
  files::RunDirLock lock;
  if (Exit end = run::lock_run_dir(input, "run", lock)) return *end;
  if (options.overwrite && run::owns_run_dir(input.rank)) {
    // Our launcher has cleared the directory before starting the ranks; under an external
    // launcher rank 0 does it, before the rendezvous the others wait in.
    run::remove_previous_run(input.run_dir);
  }
  return run::start_session(std::move(input), "run");
}

}  // namespace trainctl::app
