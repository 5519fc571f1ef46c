#include "run/timeline_file.hpp"

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "files/files.hpp"
#include "planner/planner.hpp"
#include "telemetry/pipeline_timeline.hpp"
#include "topology/topology.hpp"

namespace trainctl::run {

void write_timeline(const std::filesystem::path& run_dir, RunContext& run, int64_t step,
                    const Timeline& measured) {
  const recipe::Recipe& r = run.recipe();
  const planner::Variant layout = planner::recipe_layout(r);
  // The planner's view of the same layout on this machine (its CPU, or its GPUs as detected).
  const topology::ClusterSpec cluster =
      run.on_cuda() ? topology::detect().cluster : planner::cpu_machine();
  const Timeline planned = planner::planned_timeline(planner::estimate_time(r, cluster, layout));
  const nlohmann::json doc{{"schema", "trainctl.timeline/1"},
                           {"recipe", r.name},
                           {"layout", layout.describe()},
                           {"step", step},
                           {"measured", telemetry::timeline_json(measured, false)},
                           {"planned", telemetry::timeline_json(planned, true)}};
  files::write_file_atomically(run_dir / "timeline.json", doc.dump(2) + "\n");
  files::write_file_atomically(
      run_dir / "timeline.svg",
      telemetry::render_svg(
          measured, fmt::format("{}: {}, step {} as measured\nthe planner predicted a "
                                "bubble of {:.1f}% for this layout on this machine",
                                r.name, layout.describe(), step, 100 * planned.bubble_share())));
}

}  // namespace trainctl::run
