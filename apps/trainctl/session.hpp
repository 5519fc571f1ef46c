// A training session: what `run` and `resume` share once they know the recipe, the run directory
// and (for resume) the checkpoint to start from. Phases: check what this build can run and open
// the data (bad input: exit 2, nothing written) -> build -> run directory -> train (checkpoints,
// stop signals) -> summary.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "recipe/recipe.hpp"

namespace trainctl::app {

struct SessionInput {
  recipe::LoadedRecipe loaded;
  std::string recipe_label;  // the recipe path, for problem reports
  std::filesystem::path run_dir;
  std::optional<std::filesystem::path> resume_from;  // a checkpoints/step_<N> directory
  std::vector<std::string> notes;                    // printed first (e.g. skipped checkpoints)
};

// Prints every problem (file:line:col, or the --set) and the summary line; returns exit code 2.
int report_problems(const std::vector<recipe::Problem>& problems, const std::string& label);
// Prints "trainctl <command>: error: <message>"; returns exit code 2.
int bad_input(const std::string& command, const std::string& message);

// What this build cannot run (more than one rank, the CUDA device), located at the key that
// asked for it.
std::vector<recipe::Problem> unsupported_in_this_build(const recipe::LoadedRecipe& loaded);

// Runs the session; returns the process exit code (0, 1, 2, or kExitSavedOnSignal).
int train_session(SessionInput input);

}  // namespace trainctl::app
