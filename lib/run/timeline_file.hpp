// A run's pipeline timeline files (logging.timeline_step): timeline.json and timeline.svg.
#pragma once

#include <filesystem>

#include "layout/timeline.hpp"
#include "run/context.hpp"

namespace trainctl::run {

// RUN_DIR/timeline.json (schema trainctl.timeline/1: the step, the layout, the measured timeline
// with every action, and the planner's for the same layout) and RUN_DIR/timeline.svg (the
// measured one drawn), each replaced atomically. Rank 0 only.
void write_timeline(const std::filesystem::path& run_dir, RunContext& run, int64_t step,
                    const Timeline& measured);

}  // namespace trainctl::run
