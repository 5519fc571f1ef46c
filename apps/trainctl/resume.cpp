// `trainctl resume TARGET`: continue a run from its newest valid checkpoint, bit for bit.
#include <fmt/core.h>

#include <filesystem>

#include "ckpt/ckpt.hpp"
#include "commands.hpp"
#include "resume_plan.hpp"
#include "session.hpp"

namespace fs = std::filesystem;

namespace trainctl::app {

int resume_session(SessionInput input, const std::string& command) {
  const recipe::Recipe& r = input.loaded.recipe;
  const fs::path dir = input.run_dir / "checkpoints";
  const ckpt::ScanReport report = ckpt::scan(dir);
  const ckpt::ScanEntry* newest = report.newest_valid();
  if (!newest) {
    std::string found;
    for (const ckpt::ScanEntry& e : report.entries)
      found += fmt::format("\n  {}: {}", e.name, e.reason.empty() ? "not valid" : e.reason);
    return bad_input(
        command,
        report.entries.empty()
            ? fmt::format("{} holds no checkpoint to resume from", dir.string())
            : fmt::format("{} holds no valid checkpoint to resume from:{}", dir.string(), found));
  }
  // Newer entries are partial or corrupt: report them and move them out of the way.
  for (const ckpt::ScanEntry& e : report.entries) {
    if (&e == newest) break;
    const fs::path rejected = dir / "rejected" / e.name;
    fs::create_directories(rejected.parent_path());
    fs::remove_all(rejected);
    fs::rename(e.path, rejected);
    input.notes.push_back(fmt::format("skipped {} ({}): moved to {}, never read", e.name,
                                      e.reason.empty() ? "not valid" : e.reason,
                                      rejected.string()));
  }
  if (newest->step >= r.training.steps) {
    std::fprintf(stderr,
                 "trainctl %s: %s is at step %lld of training.steps %lld: the run is complete "
                 "(extend it with --set training.steps=N)\n",
                 command.c_str(), newest->path.string().c_str(),
                 static_cast<long long>(newest->step), static_cast<long long>(r.training.steps));
    return kExitOk;
  }
  input.notes.push_back(
      fmt::format("resuming from {} (the newest valid checkpoint)", newest->name));
  input.resume_from = newest->path;
  return train_session(std::move(input));
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
  try {
    input.loaded = recipe::load_recipe_with_origins(recipe_path, options.overrides);
  } catch (const recipe::RecipeError& e) {
    return report_problems(e.problems(), recipe_path);
  }
  if (auto problems = unsupported_in_this_build(input.loaded); !problems.empty())
    return report_problems(problems, recipe_path);
  if (input.run_dir.empty())
    input.run_dir = options.run_dir.empty() ? fs::path("runs") / input.loaded.recipe.name
                                            : fs::path(options.run_dir);
  return resume_session(std::move(input), "resume");
}

}  // namespace trainctl::app
