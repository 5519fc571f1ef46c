// A pipeline timeline's files (layout/timeline.hpp): the JSON form that `trainctl plan --timeline
// --json` prints, and a run's timeline.json and timeline.svg (logging.timeline_step).
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>

#include "layout/timeline.hpp"
#include "run/context.hpp"

namespace trainctl::run {

// {"schedule", "micro_batches", "step_s", "bubble_share", "stages": [[{"op", "micro_batch",
// "start_s", "end_s"}, ...] per stage]}; `compute_only` leaves the transfers out.
nlohmann::json timeline_json(const Timeline& timeline, bool compute_only);

// RUN_DIR/timeline.json (schema trainctl.timeline/1: the step, the layout, the measured timeline
// with every action, and the planner's for the same layout) and RUN_DIR/timeline.svg (the
// measured one drawn), each replaced atomically. Rank 0 only.
void write_timeline(const std::filesystem::path& run_dir, RunContext& run, int64_t step,
                    const Timeline& measured);

}  // namespace trainctl::run
