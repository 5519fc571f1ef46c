// trainctl validate: load a recipe (with --set overrides) and print the resolved result, or every
// problem found; --explain prints the schema table instead. The slurm.* values get the checks
// `trainctl submit` applies (lib/launch/sbatch.hpp), so a bad one is found before submission.
#include <fmt/format.h>

#include <cstdio>

#include "commands.hpp"
#include "launch/sbatch.hpp"
#include "recipe/recipe.hpp"

namespace trainctl::app {

int run_validate(const ValidateOptions& options) {
  if (options.explain) {
    fmt::print("{}", recipe::explain_table());
    return kExitOk;
  }
  try {
    const recipe::LoadedRecipe loaded =
        recipe::load_recipe_with_origins(options.recipe_path, options.overrides);
    std::vector<recipe::Problem> problems;
    for (const launch::SbatchError& e : launch::check_slurm_recipe(loaded.recipe))
      problems.push_back(loaded.origins.problem(e.key(), e.reason()));
    if (!problems.empty()) throw recipe::RecipeError(std::move(problems));
    fmt::print("{}# recipe hash: {}\n", recipe::dump_recipe(loaded.recipe),
               recipe::recipe_hash(loaded.recipe));
    return kExitOk;
  } catch (const recipe::RecipeError& error) {
    fmt::print(stderr, "{}", recipe::format_report(error.problems(), options.recipe_path));
    return kExitBadInput;
  }
}

}  // namespace trainctl::app
