// `trainctl plan RECIPE`: load the recipe, describe the cluster (a file: --cluster, else the
// recipe's cluster.file; else detect this machine), then rank the layouts that fit (lib/planner).
// Bad recipes, bad cluster files and impossible requests exit 2 with the reason.
#include <fmt/core.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string_view>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "files/files.hpp"
#include "layout/timeline.hpp"
#include "plan_auto.hpp"
#include "planner/planner.hpp"
#include "run/session.hpp"
#include "telemetry/format.hpp"
#include "telemetry/pipeline_timeline.hpp"
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

// --layout "tp=8,pp=2,zero=1": the recipe's layout with the keys given replaced; dp, when not
// given, is what is left of the cluster's GPUs; "schedule=zb-h1" the pipeline schedule, "v=2"
// the interleaved schedule's chunks per rank. Throws std::invalid_argument naming the item.
planner::Variant parse_layout(const std::string& text, const recipe::Recipe& r, int world) {
  planner::Variant v = planner::recipe_layout(r);
  bool dp_given = false, schedule_given = false, virtual_given = false;
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string item(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? std::string() : item.substr(eq + 1);
    if (eq == std::string::npos || value.empty())
      throw std::invalid_argument(
          fmt::format("--layout item '{}' is not KEY=VALUE (e.g. tp=8,pp=2,zero=1)", item));
    if (key == "recompute") {
      bool known = false;
      for (size_t i = 0; i < recipe::EnumNames<Recompute>::names.size(); ++i)
        if (recipe::EnumNames<Recompute>::names[i] == value) {
          v.recompute = recipe::choice_value<Recompute>(i);
          known = true;
        }
      if (!known)
        throw std::invalid_argument(
            fmt::format("--layout recompute={}: use none, selective or full", value));
      continue;
    }
    if (key == "schedule" || key == "pp_schedule") {  // 1f1b, interleaved (with v=N) or zb-h1
      const std::optional<PipeSchedule> schedule = parse_schedule(value);
      if (!schedule)
        throw std::invalid_argument(
            fmt::format("--layout {}={}: use 1f1b, interleaved (with v=N) or zb-h1", key, value));
      v.pp_schedule = *schedule;
      schedule_given = true;
      continue;
    }
    int number = 0;
    const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
    if (error != std::errc() || end != value.data() + value.size() || number < 0)
      throw std::invalid_argument(
          fmt::format("--layout {}={}: not a whole number >= 0", key, value));
    if (key == "tp")
      v.tp = number;
    else if (key == "pp")
      v.pp = number;
    else if (key == "ep")
      v.ep = number;
    else if (key == "cp")
      v.cp = number;
    else if (key == "zero")
      v.zero = number;
    else if (key == "v" || key == "pp_virtual") {  // the interleaved schedule's chunks per rank
      v.pp_virtual = number;
      virtual_given = true;
    } else if (key == "sp" || key == "sequence_parallel") {
      if (number > 1)
        throw std::invalid_argument(fmt::format("--layout {}={}: use 0 or 1", key, value));
      v.sequence_parallel = number == 1;
    } else if (key == "mb" || key == "micro_batch")
      v.micro_batch = number;
    else if (key == "dp") {
      v.dp = number;
      dp_given = true;
    } else {
      throw std::invalid_argument(fmt::format(
          "--layout key '{}' is unknown: use tp, pp, dp, ep, cp, zero, sp, mb, v (interleaved "
          "chunks per stage), schedule (1f1b, interleaved or zb-h1) and recompute",
          key));
    }
  }
  // v=N alone picks the schedule its chunks need (interleaved for N > 1, else 1F1B); schedule=S
  // alone runs the recipe's chunks when S is interleaved, else one chunk per rank. Both given:
  // as given (a mismatch is the preview's problem to name).
  if (virtual_given && !schedule_given)
    v.pp_schedule = v.pp_virtual > 1 ? PipeSchedule::interleaved : PipeSchedule::one_f_one_b;
  if (schedule_given && !virtual_given && v.pp_schedule != PipeSchedule::interleaved)
    v.pp_virtual = 1;
  const int64_t others = int64_t{v.tp} * v.pp * v.ep * v.cp;
  if (!dp_given && others > 0 && world % others == 0) v.dp = static_cast<int>(world / others);
  if (v.micro_batch < 1)
    throw std::invalid_argument(fmt::format("--layout mb={}: must be >= 1", v.micro_batch));
  return v;
}

// The layout `--timeline` draws: the preview when it was estimated, else the best ranked.
struct Drawn {
  planner::Variant layout;
  planner::TimeEstimate time;
  std::string origin;
};
std::optional<Drawn> drawn_layout(const planner::Plan& plan) {
  if (plan.preview && plan.preview->estimated && plan.preview->problem.empty())
    return Drawn{plan.preview->layout, plan.preview->time, plan.preview->origin};
  if (plan.preview)
    std::fprintf(stderr,
                 "trainctl plan: note: %s does not run here (see the preview), so the timeline "
                 "draws the best layout\n",
                 plan.preview->origin.c_str());
  if (!plan.ranked.empty())
    return Drawn{plan.ranked.front().layout, plan.ranked.front().time, "the best layout"};
  return std::nullopt;
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
  if (options.ranks > 0 && !cluster.cpu_only)
    return bad_input("plan", fmt::format("--ranks {} plans CPU ranks, but this plan is for {} "
                                         "(GPUs): set their number with --nodes and "
                                         "--gpus-per-node",
                                         options.ranks, cluster.spec.name));
  if (cluster.cpu_only) {
    const int ranks = std::max(options.ranks, 1);
    std::fputs(fmt::format("trainctl plan: note: no GPU here and no cluster file: planning for "
                           "this machine's CPU ({}); pass --cluster FILE (configs/clusters/) to "
                           "plan for a cluster\n",
                           ranks == 1 ? std::string("a world of 1; --ranks N for N CPU ranks")
                                      : fmt::format("{} CPU ranks", ranks))
                   .c_str(),
               stderr);
    cluster.spec = planner::cpu_machine(ranks);
  }

  if (!options.timeline_svg.empty()) {  // checked before anything is planned or written
    const std::filesystem::path svg(options.timeline_svg);
    const std::filesystem::path dir = svg.has_parent_path() ? svg.parent_path() : ".";
    std::error_code error;
    if (!std::filesystem::is_directory(dir, error))
      return bad_input("plan", fmt::format("--timeline-svg {}: the folder {} does not exist; "
                                           "create it or write the page elsewhere",
                                           options.timeline_svg, dir.string()));
    if (const std::string why = files::why_not_writable_directory(dir); !why.empty())
      return bad_input("plan", fmt::format("--timeline-svg {}: {}", options.timeline_svg, why));
  }

  // What to preview first: --layout, else the recipe's own layout (none for parallel: auto).
  const int world = std::max(1, cluster.spec.world_size());
  std::optional<planner::Variant> previewed;
  std::string origin;
  if (!options.layout.empty()) {
    try {
      previewed = parse_layout(options.layout, loaded.recipe, world);
    } catch (const std::invalid_argument& e) {
      return bad_input("plan", e.what());
    }
    origin = "--layout " + options.layout;
  } else if (!loaded.recipe.parallel.automatic && !options.recipe_path.empty()) {
    previewed = planner::recipe_layout(loaded.recipe);
    origin = "the recipe's layout (" + options.recipe_path + ")";
  }
  planner::Plan plan;
  try {
    plan = planner::make_plan(loaded.recipe, cluster.spec);
  } catch (const planner::PlanError& e) {
    // No layout runs: the preview still says what binds it, then the search's reasons.
    planner::Plan empty;
    empty.cluster = cluster.spec;
    empty.world = world;
    if (previewed)
      empty.preview = planner::preview_layout(loaded.recipe, empty, *previewed, origin);
    if (options.json) {
      std::fputs((planner::plan_json(empty, loaded.recipe, 0, e.what()) + "\n").c_str(), stdout);
      return kExitBadInput;
    }
    std::fputs(planner::format_preview(empty).c_str(), stdout);
    return bad_input("plan", e.what());
  }
  if (previewed) plan.preview = planner::preview_layout(loaded.recipe, plan, *previewed, origin);
  std::string out = options.json ? planner::plan_json(plan, loaded.recipe, options.top) + "\n"
                                 : planner::format_plan(plan, loaded.recipe, options.top);
  if (options.timeline || !options.timeline_svg.empty()) {
    const std::optional<Drawn> drawn = drawn_layout(plan);
    if (drawn) {
      const Timeline t = planner::planned_timeline(drawn->time);
      if (!options.timeline_svg.empty()) {
        files::write_file_atomically(
            options.timeline_svg,
            telemetry::render_svg(t, fmt::format("{}: {} ({})", loaded.recipe.name,
                                                 drawn->layout.describe(), drawn->origin)));
        std::fprintf(stderr, "trainctl plan: wrote the pipeline timeline to %s\n",
                     options.timeline_svg.c_str());
      }
      if (options.timeline && options.json) {
        nlohmann::json doc = nlohmann::json::parse(out);
        nlohmann::json timeline = telemetry::timeline_json(t, true);
        timeline["layout"] = drawn->layout.describe();
        timeline["origin"] = drawn->origin;
        doc["timeline"] = std::move(timeline);
        out = doc.dump(2) + "\n";
      } else if (options.timeline) {
        out += fmt::format("\npipeline timeline of {} ({}), on the planner's stage times:\n{}",
                           drawn->layout.describe(), drawn->origin, telemetry::render_text(t));
      }
    }
  }
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

AutoWorld auto_world(const recipe::Recipe& r, const launch::RankInfo& rank, int ranks) {
  AutoWorld w;
  // The engine's own choice: cluster.device auto stays on the CPU (run/context.cpp).
  const auto uses_gpus = [&] { return r.cluster.device == recipe::Device::cuda; };
  if (rank.launched()) {
    if (ranks > 0 && ranks != rank.world_size)
      throw std::invalid_argument(fmt::format(
          "--ranks {}, but {} started {} rank{}: drop --ranks (the launcher sets the world)", ranks,
          launch::rank_source_name(rank.source), rank.world_size, rank.world_size == 1 ? "" : "s"));
    w.world = rank.world_size;
    const int local = rank.local_world_size;
    w.per_node = local >= 1 && local <= w.world && w.world % local == 0 ? local : 1;
    w.nodes = w.world / w.per_node;
    w.gpus = uses_gpus();
    if (rank.source == launch::RankSource::trainctl && ranks > 0)
      w.why = fmt::format("--ranks {}", ranks);  // our launcher started what --ranks asked for
    else
      w.why = fmt::format("{} started {} rank{}{}", launch::rank_source_name(rank.source), w.world,
                          w.world == 1 ? "" : "s",
                          w.nodes > 1 ? fmt::format(" on {} nodes", w.nodes) : "");
    return w;
  }
  if (ranks > 0) {
    w.world = w.per_node = ranks;
    w.gpus = uses_gpus();
    w.why = fmt::format("--ranks {}", ranks);
    return w;
  }
  if (uses_gpus()) {
    w.detected = topology::detect().cluster;
    const int gpus = w.detected->gpus_per_node;
    if (gpus > 0) {
      w.world = w.per_node = gpus;
      w.gpus = true;
      w.why = fmt::format("this machine's {} GPU{}", gpus, gpus == 1 ? "" : "s");
      return w;
    }
  }
  w.why = "this machine, one CPU rank; run --ranks N plans for N";
  return w;
}

std::string resolve_parallel_auto(recipe::Recipe& r, const AutoWorld& world) {
  if (!r.parallel.automatic) return {};
  topology::ClusterSpec machine;
  if (!world.gpus) {
    machine = planner::cpu_machine(world.per_node, world.nodes);
  } else {
    const topology::ClusterOverrides overrides{world.nodes, world.per_node};
    machine = !r.cluster.file.empty()
                  ? topology::load_cluster(r.cluster.file, overrides)
                  : topology::apply_overrides(
                        world.detected ? *world.detected : topology::detect().cluster, overrides);
  }
  const planner::Plan plan = planner::make_plan(r, machine);
  const planner::Candidate& top = plan.ranked.front();
  const planner::Variant& best = top.layout;
  static_cast<Layout&>(r.parallel) = best;  // degrees, zero, recompute: one layout value
  r.training.micro_batch = best.micro_batch;
  r.parallel.pp_schedule = best.pp_schedule;
  r.parallel.pp_virtual = best.pp_virtual;
  r.parallel.automatic = false;  // the run directory's recipe.yaml records what actually ran
  const double step = top.time.step_s;
  std::string why =
      fmt::format("ranked first of {} layout{} on {} ({} a step predicted, {} a rank)",
                  plan.ranked.size(), plan.ranked.size() == 1 ? "" : "s", machine.name,
                  step < 1e-3 ? fmt::format("{:.1f} us", step * 1e6)
                  : step < 1  ? fmt::format("{:.1f} ms", step * 1e3)
                              : fmt::format("{:.2f} s", step),
                  telemetry::format_bytes(static_cast<uint64_t>(top.memory.total())));
  if (plan.ranked.size() > 1)
    why += fmt::format("; next, {}: {}", plan.ranked[1].layout.describe(),
                       planner::explain_loss(top, plan.ranked[1], machine));
  return fmt::format("parallel: auto -> {} for a world of {} ({}): {}", best.describe(),
                     world.world, world.why, why);
}

}  // namespace trainctl::app
