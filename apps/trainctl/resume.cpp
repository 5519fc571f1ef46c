// `trainctl resume TARGET`: continue a run from its newest valid checkpoint, bit for bit.
#include <fmt/core.h>

#include <filesystem>

#include "ckpt/ckpt.hpp"
#include "commands.hpp"
#include "resume_plan.hpp"
#include "session.hpp"

namespace fs = std::filesystem;

namespace trainctl::app {

int check_resume_input(const SessionInput& input, const std::string& command,
                       const ckpt::ScanReport& report) {
  const fs::path dir = input.run_dir / "checkpoints";
  if (report.entries.empty())
    return bad_input(command, fmt::format("{} holds no checkpoint to resume from", dir.string()));
  // training.steps below the checkpoint's step cannot be met.
  const int64_t steps = input.loaded.recipe.training.steps;
  if (const ckpt::ScanEntry* newest = report.newest_valid(); newest && newest->step > steps)
    return report_problems(
        {input.loaded.origins.problem(
            "training.steps",
            fmt::format("training.steps {} is below step {} of the checkpoint to resume from "
                        "({}); a run cannot go back: set training.steps to {} or more (e.g. "
                        "--set training.steps={}), or start again with trainctl run --overwrite",
                        steps, newest->step, newest->path.string(), newest->step, newest->step))},
        input.recipe_label);
  return -1;
}

int resume_session(SessionInput input, const std::string& command) {
  // The lock first, then the scan it will train from: a save that another trainctl had in
  // progress when the checks ran must not be seen half done.
  files::RunDirLock lock;
  if (int code = lock_run_dir(input, command, lock); code >= 0) return code;
  ckpt::ScanReport report = ckpt::scan(input.run_dir / "checkpoints");
  if (int code = check_resume_input(input, command, report); code >= 0) return code;
  input.resuming = true;
  input.resume_candidates = std::move(report.entries);
  return start_session(std::move(input), command);
}

int run_resume(const ResumeOptions& options) {
  SessionInput input;
  std::error_code ec;
  const fs::path target(options.target);
  std::string recipe_path;
  if (fs::is_directory(target, ec)) {
    if (!options.run_dir.empty())
      return bad_input("resume", "--run-dir goes with a recipe file; " + options.target +
                                     " is already a run directory");
    recipe_path = (target / "recipe.yaml").string();
    if (!fs::exists(recipe_path))
      return bad_input("resume", fmt::format("{} is not a run directory (no recipe.yaml); give "
                                             "the run directory trainctl run created, or the "
                                             "recipe file",
                                             options.target));
    input.run_dir = target;
  } else if (fs::exists(target, ec)) {
    recipe_path = options.target;
  } else {
    return bad_input("resume",
                     options.target + " does not exist (give a run directory or a recipe)");
  }
  input.recipe_label = recipe_path;
  input.debug_save_delay = std::chrono::milliseconds(options.debug_save_delay_ms);
  try {
    input.loaded = recipe::load_recipe_with_origins(recipe_path, options.overrides);
  } catch (const recipe::RecipeError& e) {
    return report_problems(e.problems(), recipe_path);
  }
  if (auto problems = unsupported_in_this_build(input.loaded); !problems.empty())
    return report_problems(problems, recipe_path);
  if (int code = check_rank_environment(input, "resume"); code >= 0) return code;
  if (input.run_dir.empty())
    input.run_dir = options.run_dir.empty() ? fs::path("runs") / input.loaded.recipe.name
                                            : fs::path(options.run_dir);
  // Cheapest first: the checkpoints, then the data (a full read of it).
  if (int code = check_resume_input(input, "resume", ckpt::scan(input.run_dir / "checkpoints"));
      code >= 0)
    return code;
  if (int code = check_session_input(input, "resume"); code >= 0) return code;
  return resume_session(std::move(input), "resume");
}

}  // namespace trainctl::app
