// `parallel: auto`: `run` asks the planner for the layout instead of reading parallel.* from the
// recipe. Implemented in plan.cpp beside `trainctl plan`, which prints the same plan.
#pragma once

#include <optional>
#include <string>

#include "launch/rank_env.hpp"
#include "recipe/recipe.hpp"
#include "topology/topology.hpp"

namespace trainctl::app {

// The world `parallel: auto` plans for: the job's ranks, and why that many.
struct AutoWorld {
  int world = 1;      // ranks
  int nodes = 1;      // nodes they are on
  int per_node = 1;   // ranks per node (world = nodes * per_node)
  bool gpus = false;  // one GPU per rank (else CPU ranks)
  std::string why;    // "--ranks 2", "srun started 8 ranks on 2 nodes", "this machine's 4 GPUs"
  // This machine as detected when the world was counted from its GPUs (detected once).
  std::optional<topology::ClusterSpec> detected;
};

// The world of the job this process belongs to: a launcher's (srun, torchrun, trainctl's own:
// its world size and ranks per node), else `ranks` (run --ranks N: trainctl starts N ranks on
// this machine), else this machine's GPUs when the run uses them (cluster.device: cuda), else
// one CPU rank. Throws
// std::invalid_argument when --ranks contradicts the launcher's world.
AutoWorld auto_world(const recipe::Recipe& recipe, const launch::RankInfo& rank, int ranks);

// When recipe.parallel.automatic is set: plans the recipe for `world` (the recipe's
// cluster.file, or this machine's detected GPUs, with the world's nodes and ranks per node; CPU
// ranks: planner::cpu_machine) and writes the top layout into recipe.parallel (tp, pp, dp, ep,
// zero, recompute, schedule) and recipe.training.micro_batch. A pure function of the recipe, the
// world and the machine description, so every rank of a job computes the same layout. Returns a
// note saying what was chosen, for which world and why ("parallel: auto -> tp=1 pp=1 dp=2 ...
// for a world of 2 (--ranks 2): ..."), or "" when the recipe does not ask for it. Throws
// planner::PlanError when nothing fits, topology::ClusterError for a bad cluster file.
std::string resolve_parallel_auto(recipe::Recipe& recipe, const AutoWorld& world);

}  // namespace trainctl::app
