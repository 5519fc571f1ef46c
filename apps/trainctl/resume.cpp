// `trainctl resume TARGET`: continue a run from its newest valid checkpoint, bit for bit.
#include <fmt/core.h>

#include <filesystem>

#include "ckpt/ckpt.hpp"
#include "commands.hpp"
#include "run/session.hpp"

namespace fs = std::filesystem;

namespace trainctl::app {

int run_resume(const ResumeOptions& options) {
  run::SessionInput input;
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
  input.debug_slow_rank = {options.debug_slow_rank.first,
                           std::chrono::milliseconds(options.debug_slow_rank.second)};
  input.debug_batches = {options.debug_batches.nan, options.debug_batches.spike,
                         options.debug_batches.drop};
  try {
    input.loaded = recipe::load_recipe_with_origins(recipe_path, options.overrides);
  } catch (const recipe::RecipeError& e) {
    return report_problems(e.problems(), recipe_path);
  }
  if (auto problems = run::unsupported_in_this_build(input.loaded); !problems.empty())
    return report_problems(problems, recipe_path);
  if (Exit end = run::check_rank_environment(input, "resume")) return *end;
  if (input.run_dir.empty())
    input.run_dir = options.run_dir.empty() ? fs::path("runs") / input.loaded.recipe.name
                                            : fs::path(options.run_dir);
  // Cheapest first: the checkpoints, then the data (a full read of it).
  if (Exit end =
          run::check_resume_input(input, "resume", ckpt::scan(input.run_dir / "checkpoints")))
    return *end;
  input.resuming = true;  // the checkpoint, not model.init_from, gives the weights
  if (Exit end = run::check_session_input(input, "resume")) return *end;
  return run::resume_session(std::move(input), "resume");
}

}  // namespace trainctl::app
