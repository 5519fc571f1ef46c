// trainctl validate: load a recipe (with --set overrides) and print the resolved result, or every
// problem found; --explain prints the schema table instead.
#include <cstdio>

#include <fmt/format.h>

#include "commands.hpp"
#include "recipe/recipe.hpp"

namespace trainctl::app {

int run_validate(const ValidateOptions& options) {
  if (options.explain) {
    fmt::print("{}", recipe::explain_table());
    return kExitOk;
  }
  try {
    recipe::Recipe resolved = recipe::load_recipe(options.recipe_path, options.overrides);
    fmt::print("{}# recipe hash: {}\n", recipe::dump_recipe(resolved),
               recipe::recipe_hash(resolved));
    return kExitOk;
  } catch (const recipe::RecipeError& error) {
    fmt::print(stderr, "{}", recipe::format_report(error.problems(), options.recipe_path));
    return kExitBadInput;
  }
}

}  // namespace trainctl::app
