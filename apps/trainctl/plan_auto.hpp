// `parallel: auto`: `run` asks the planner for the layout instead of reading parallel.* from the
// recipe. Implemented in plan.cpp beside `trainctl plan`, which prints the same plan.
#pragma once

#include <string>

#include "recipe/recipe.hpp"

namespace trainctl::app {

// When recipe.parallel.automatic is set: plans the recipe for this machine (this build runs one
// CPU rank, so the world is 1) and writes the top layout into recipe.parallel (tp, pp, dp, ep,
// zero, recompute) and recipe.training.micro_batch. Returns a one-line note saying what was
// chosen ("parallel: auto -> tp=1 pp=1 dp=1 ep=1 mb=4 zero=0 recompute=none (planner, world
// of 1)"), or "" when the recipe does not ask for it. Throws planner::PlanError when nothing fits.
std::string resolve_parallel_auto(recipe::Recipe& recipe);

}  // namespace trainctl::app
