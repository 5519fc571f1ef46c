// The pictures of a pipeline timeline (layout/timeline.hpp): for a terminal, and as an SVG page
// beside the run's other pages (run_report.hpp). `trainctl plan --timeline` draws the planner's
// schedule, a run with logging.timeline_step the one it measured.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "layout/timeline.hpp"

namespace trainctl::telemetry {

// One row per stage over `width` columns: F/f a forward, B/b a backward (with ZB-H1 its
// input-gradient pass), W/w a weight-gradient pass (ZB-H1) (upper case for even micro-batches,
// lower case for odd, so neighbours stay apart), '.' idle; then a time scale, a legend and the
// bubble share. With many micro-batches only the fill and the drain are drawn.
std::string render_text(const Timeline& timeline, int width = 72);

// The same as an SVG page for a browser: a bar per stage, a box per forward (blue), backward
// (orange) and weight-gradient pass (green, ZB-H1; then a legend entry "weight gradient")
// labelled with its micro-batch, a time axis, and `title` (its lines split at '\n', the first in
// bold) with the bubble share above it. Each box carries data-stage, data-op (op_name: forward,
// backward, weight_grad) and data-micro-batch attributes.
std::string render_svg(const Timeline& timeline, const std::string& title);

// The timeline as data: {"schedule", "micro_batches", "step_s", "bubble_share", "stages": [[{"op",
// "micro_batch", "start_s", "end_s"}, ...] per stage]}; `compute_only` leaves the transfers out.
// `trainctl plan --timeline --json` prints it, a run's timeline.json holds it.
nlohmann::json timeline_json(const Timeline& timeline, bool compute_only);

}  // namespace trainctl::telemetry
