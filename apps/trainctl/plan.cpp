// `trainctl plan RECIPE`: load the recipe, describe the cluster (a file: --cluster, else the
// recipe's cluster.file; else detect this machine), then rank the layouts that fit (lib/planner).
// Bad recipes, bad cluster files and impossible requests exit 2 with the reason.
#include <fmt/core.h>

#include <cstdio>

#include "commands.hpp"
#include "plan_auto.hpp"
#include "planner/planner.hpp"
#include "run/session.hpp"
#include "topology/topology.hpp"

namespace trainctl::app {

namespace {

// The cluster to plan for, or a message (thrown as topology::ClusterError by lib/topology).
struct ClusterChoice {
  topology::ClusterSpec spec;
  std::string description;  // for --show-topology
  bool cpu_only = false;
};

ClusterChoice choose_cluster(const PlanOptions& options, const recipe::LoadedRecipe& loaded) {
  const recipe::Recipe& r = loaded.recipe;
  topology::ClusterOverrides overrides{options.nodes, options.gpus_per_node};
  // The recipe's cluster.nodes / gpus_per_node count when the user wrote them and the CLI did not.
  if (overrides.nodes == 0 && loaded.origins.of("cluster.nodes").user_set())
    overrides.nodes = r.cluster.nodes;
  if (overrides.gpus_per_node == 0 && loaded.origins.of("cluster.gpus_per_node").user_set())
    overrides.gpus_per_node = r.cluster.gpus_per_node;
  const std::string file = !options.cluster_file.empty() ? options.cluster_file : r.cluster.file;
  ClusterChoice choice;
  if (!file.empty()) {
    choice.spec = topology::load_cluster(file, overrides);
    choice.description = topology::describe(choice.spec);
  } else {
    topology::Detection detection = topology::detect();
    choice.spec = topology::apply_overrides(detection.cluster, overrides);
    detection.cluster = choice.spec;
    choice.description = topology::describe(detection);
  }
  choice.cpu_only = choice.spec.gpus_per_node == 0;
  return choice;
}

}  // namespace

int run_plan(const PlanOptions& options) {
  if (options.recipe_path.empty() && !options.show_topology)
    return bad_input("plan", "give a recipe: trainctl plan RECIPE [--cluster FILE]");
  recipe::LoadedRecipe loaded;
  if (!options.recipe_path.empty()) {
    try {
      loaded = recipe::load_recipe_with_origins(options.recipe_path, options.overrides);
    } catch (const recipe::RecipeError& e) {
      return report_problems(e.problems(), options.recipe_path);
    }
  } else {
    loaded.recipe = recipe::default_recipe();
  }

  ClusterChoice cluster;
  try {
    cluster = choose_cluster(options, loaded);
  } catch (const topology::ClusterError& e) {
    std::fputs(e.what(), stderr);
    std::fputs("\n", stderr);
    return kExitBadInput;
  }
  if (options.show_topology) {
    std::fputs(cluster.description.c_str(), stdout);
    if (!cluster.description.ends_with('\n')) std::fputs("\n", stdout);
    return kExitOk;
  }
  if (cluster.cpu_only) {
    std::fputs(
        "trainctl plan: note: no GPU here and no cluster file: planning for this machine's CPU "
        "(a world of 1); pass --cluster FILE (configs/clusters/) to plan for a cluster\n",
        stderr);
    cluster.spec = planner::cpu_machine();
  }

  planner::Plan plan;
  try {
    plan = planner::make_plan(loaded.recipe, cluster.spec);
  } catch (const planner::PlanError& e) {
    return bad_input("plan", e.what());
  }
  const std::string out = options.json ? planner::plan_json(plan, loaded.recipe, options.top) + "\n"
                                       : planner::format_plan(plan, loaded.recipe, options.top);
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

std::string resolve_parallel_auto(recipe::Recipe& r) {
  if (!r.parallel.automatic) return {};
  const planner::Plan plan = planner::make_plan(r, planner::cpu_machine());
  const planner::Variant& best = plan.ranked.front().layout;
  static_cast<Layout&>(r.parallel) = best;  // degrees, zero, recompute: one layout value
  r.training.micro_batch = best.micro_batch;
  r.parallel.automatic = false;  // the run directory's recipe.yaml records what actually ran
  return fmt::format("parallel: auto -> {} (planner, this machine: a world of 1)", best.describe());
}

}  // namespace trainctl::app
